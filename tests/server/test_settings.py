"""Settings parsing: typed, fully defaulted, camelCase keys, unknown keys ignored, bad values reported."""

from __future__ import annotations

from llada_lsp.server.settings import Settings, camel, parse_settings, settings_section

DEFAULTS = Settings()


def test_defaults_match_the_protocol_table():
    assert Settings(model=None, inline_mode="speed", rewrite_mode="quality",
                                max_completion_tokens=64, context_tokens=1024) == DEFAULTS  # fmt: skip


def test_camel_case_keys_are_read():
    raw = {
        "model": "/m",
        "inlineMode": "quality",
        "rewriteMode": "speed",
        "maxCompletionTokens": 16,
        "contextTokens": 256,
    }
    settings, errors = parse_settings(raw, DEFAULTS, DEFAULTS)
    assert errors == []
    assert settings == Settings("/m", "quality", "speed", 16, 256)
    assert camel("max_completion_tokens") == "maxCompletionTokens"


def test_unknown_keys_are_ignored_and_absent_keys_keep_the_current_value():
    current = Settings(model="/m", inline_mode="quality")
    raw = {"rewriteMode": "speed", "somethingElse": 1, "inline_mode": "speed"}
    settings, errors = parse_settings(raw, current, DEFAULTS)
    assert errors == []
    assert settings == Settings(model="/m", inline_mode="quality", rewrite_mode="speed")


def test_bad_values_fall_back_to_their_default_and_are_reported():
    current = Settings(inline_mode="quality", max_completion_tokens=8)
    launch = Settings(inline_mode="speed", max_completion_tokens=32)
    raw = {"inlineMode": "fast", "maxCompletionTokens": 0, "contextTokens": True, "model": 3, "rewriteMode": None}
    settings, errors = parse_settings(raw, current, launch)
    assert settings == Settings(None, "speed", "quality", max_completion_tokens=32, context_tokens=1024)
    assert len(errors) == 5
    assert any("inlineMode" in e and "'fast'" in e and "'speed'" in e for e in errors)
    assert any("maxCompletionTokens" in e and "1..512" in e for e in errors)


def test_ranges_include_their_ends_and_nothing_past_them():
    for key, name, lo, hi in (("maxCompletionTokens", "max_completion_tokens", 1, 512),
                              ("contextTokens", "context_tokens", 64, 8192)):  # fmt: skip
        for value in (lo, hi):
            settings, errors = parse_settings({key: value}, DEFAULTS, DEFAULTS)
            assert errors == [] and getattr(settings, name) == value, (key, value)
        for value in (lo - 1, hi + 1):
            settings, errors = parse_settings({key: value}, DEFAULTS, DEFAULTS)
            assert settings == DEFAULTS and len(errors) == 1 and f"{lo}..{hi}" in errors[0], (key, value)
    settings, errors = parse_settings({"maxCompletionTokens": True}, DEFAULTS, DEFAULTS)  # True == 1 in Python
    assert settings == DEFAULTS and len(errors) == 1


def test_a_null_model_is_the_default_model():
    launch = Settings(model="/from/the/command/line")
    settings, errors = parse_settings({"model": None}, Settings(model="/other"), launch)
    assert settings.model == "/from/the/command/line" and errors == []
    assert parse_settings({"model": ""}, Settings(model="/other"), DEFAULTS)[0].model is None


def test_integral_floats_pass_and_not_an_object_is_reported():
    settings, errors = parse_settings({"contextTokens": 512.0}, DEFAULTS, DEFAULTS)
    assert settings.context_tokens == 512 and isinstance(settings.context_tokens, int) and errors == []
    settings, errors = parse_settings(["inlineMode"], DEFAULTS, DEFAULTS)
    assert settings == DEFAULTS and len(errors) == 1
    assert parse_settings(None, DEFAULTS, DEFAULTS) == (DEFAULTS, [])


def test_did_change_configuration_section():
    assert settings_section({"llada": {"inlineMode": "quality"}}) == {"inlineMode": "quality"}
    assert settings_section({"inlineMode": "quality"}) == {"inlineMode": "quality"}
    assert settings_section(None) is None


def test_the_engine_setting_is_an_address_or_auto_or_local():
    ok, errors = parse_settings({"engine": "unix:/run/user/1000/llada-lsp/engine.sock"}, Settings(), Settings())
    assert ok.engine == "unix:/run/user/1000/llada-lsp/engine.sock" and errors == []
    assert parse_settings({"engine": "local"}, Settings(), Settings())[0].engine == "local"
    assert parse_settings({"engine": ""}, Settings(engine="local"), Settings())[0].engine is None
    for bad in ("gpu", "tcp://host", 7077, "unix:/" + "x" * 200):
        s, errors = parse_settings({"engine": bad}, Settings(), Settings())
        assert s.engine is None and len(errors) == 1 and errors[0].startswith("setting engine:"), bad
