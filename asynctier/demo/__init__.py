"""The demo: three workloads modelled on the seeds, run end to end by ``asynctier demo``.

A media upload that encodes several resolutions (normal tier), a live-stream notification
(urgent: useless if late) and friend suggestions (batch: useless only if never). Some
uploads fail for a while and recover through the delay topics; a few never recover and
land in the dead-letter topic.
"""
