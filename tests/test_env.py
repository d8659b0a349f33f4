"""daisy.space.env: env_number, the one parser of DAISY_* numbers (signaling, connection guard,
parse sandbox, stored runs, data stream), and env_flag, the one parser of DAISY_* switches."""
import math

import pytest

from daisy.space.env import env_flag, env_number


def test_env_number_reads_defaults_and_refuses_bad_values_by_name():
    assert env_number({}, "DAISY_X", 7) == 7
    assert env_number({"DAISY_X": ""}, "DAISY_X", 7) == 7            # set but empty: the default
    assert env_number({"DAISY_X": "2.5"}, "DAISY_X", 7) == 2.5
    assert env_number({"DAISY_X": "3"}, "DAISY_X", 7, int) == 3
    assert env_number({"DAISY_X": "0"}, "DAISY_X", 7, int, allow_zero=True) == 0
    refused = [({"DAISY_X": "soon"}, {}, "must be a number, got 'soon'"),
               ({"DAISY_X": "2.5"}, {"kind": int}, "must be a whole number"),
               ({"DAISY_X": "0"}, {}, "must be > 0"),
               ({"DAISY_X": "nan"}, {}, "must be > 0"),
               ({"DAISY_X": "-1"}, {"allow_zero": True}, "must be >= 0")]
    for env, kw, message in refused:
        with pytest.raises(ValueError, match=f"DAISY_X must be {message.split('must be ')[1]}"):
            env_number(env, "DAISY_X", 7, **kw)
    assert math.isinf(env_number({"DAISY_X": "inf"}, "DAISY_X", 7))


def test_env_flag_reads_switches_and_refuses_others_by_name():
    assert env_flag({}, "DAISY_Y") is False and env_flag({"DAISY_Y": ""}, "DAISY_Y", True) is True
    assert [env_flag({"DAISY_Y": v}, "DAISY_Y") for v in ("1", "TRUE", "yes", "On", "0", "false", "no", "off")] == \
        [True] * 4 + [False] * 4
    with pytest.raises(ValueError, match="DAISY_Y must be 1/true/yes/on or 0/false/no/off, got 'maybe'"):
        env_flag({"DAISY_Y": "maybe"}, "DAISY_Y")
