-- Take tokens of a binding's bucket (after take_tokens.lua, which says KEYS and ARGV).
return take_tokens(KEYS, ARGV)
