"""``asynctier quota set | show`` against the real Redis, under the test's prefix."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from asynctier.cli import main
from asynctier.platform.config import Settings


def run(settings: Settings, *args: str) -> tuple[int, str]:
    env = {"ASYNCTIER_REDIS_URL": settings.redis_url, "ASYNCTIER_PREFIX": settings.prefix}
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


def test_quota_set_then_show(settings: Settings, redis_client: redis.Redis) -> None:
    code, out = run(settings, "quota", "set", "acme", "--per-minute", "500",
                    "--per-day", "100000")
    assert code == 0, out
    assert "500 per minute" in out
    code, out = run(settings, "quota", "set", "beta.team", "--per-day", "20")
    assert code == 0, out
    assert redis_client.hgetall(settings.names.tenant_key("acme", "quota")) == {
        b"per_minute": b"500", b"per_day": b"100000"}

    code, out = run(settings, "quota", "show", "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert rows == [
        {"tenant": "acme", "per_minute": 500, "per_day": 100000, "used_minute": 0,
         "used_day": 0, "refused": None},
        {"tenant": "beta.team", "per_minute": None, "per_day": 20, "used_minute": 0,
         "used_day": 0, "refused": None},
    ]
    code, out = run(settings, "quota", "show")
    assert code == 0 and "acme" in out and "beta.team" in out

    code, out = run(settings, "quota", "set", "acme", "--per-day", "7")  # replaces
    assert code == 0
    assert json.loads(run(settings, "quota", "show", "--json")[1])[0]["per_minute"] is None


def test_quota_set_refuses_bad_input(settings: Settings, redis_client: redis.Redis) -> None:
    assert run(settings, "quota", "set", "acme")[0] == 2  # neither window
    assert run(settings, "quota", "set", "acme", "--per-minute", "0")[0] == 2
    assert run(settings, "quota", "set", "bad tenant!", "--per-day", "5")[0] == 2
    code, out = run(settings, "quota", "show")
    assert code == 0 and "no quotas set" in out


def test_quota_show_names_an_unreachable_redis(settings: Settings) -> None:
    code, out = run(settings.with_overrides(redis_url="redis://127.0.0.1:1/0"), "quota", "show")
    assert code == 2
    assert "redis://127.0.0.1:1/0 does not answer" in out


def test_quota_show_lists_a_bad_quota_as_refused_and_the_others(
        settings: Settings, redis_client: redis.Redis) -> None:
    """A quota hash written by something else (-1) neither stops `quota show` nor hides
    the good ones: it is listed as refused, with why and the fix."""
    assert run(settings, "quota", "set", "acme", "--per-minute", "500")[0] == 0
    redis_client.hset(settings.names.tenant_key("zeta", "quota"), "per_minute", "-1")
    code, out = run(settings, "quota", "show", "--json")
    assert code == 0, out
    rows = {r["tenant"]: r for r in json.loads(out)}
    assert rows["acme"]["per_minute"] == 500 and rows["acme"]["refused"] is None
    assert "not a whole number >= 1" in rows["zeta"]["refused"]
    code, out = run(settings, "quota", "show")
    assert code == 0 and "zeta" in out and "refused" in out and "asynctier quota set zeta" in out
