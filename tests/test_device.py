"""DeviceProfile: measured block costs for every (bits, block), cached per machine, bit rounding."""

import pytest

from sparta_explore.device import BLOCKS, DeviceProfile, ProfileShape, machine_key


def test_every_width_and_block_has_a_positive_measured_cost(device):
    assert 32 in device.bits and device.blocks == BLOCKS
    for bits in device.bits:
        for block in device.blocks:
            assert device.block_ns(bits, block) > 0
        assert device.dense_costs[bits] > 0
    assert device.seconds > 0 and device.threads >= 1


def test_predictions_scale_with_blocks_and_rows(device):
    one = device.predict_ms(n_blocks=10, block=(32, 32), bits=32, m=100)
    assert device.predict_ms(n_blocks=20, block=(32, 32), bits=32, m=100) > one
    assert device.predict_ms(n_blocks=10, block=(32, 32), bits=32, m=1000) > one
    assert device.dense_ms(out_features=64, in_features=64, bits=32, m=10) > 0


def test_round_bits_goes_up_to_a_width_the_device_runs(device):
    assert device.round_bits(0) == 0
    assert device.round_bits(12) == 32
    if 8 in device.bits:
        assert device.round_bits(3) == 8 and device.round_bits(8) == 8
    with pytest.raises(ValueError, match="exceeds"):
        device.round_bits(64)


def test_unknown_block_names_what_the_device_has(device):
    with pytest.raises(KeyError, match="blocks"):
        device.block_ns(32, (3, 5))


def test_json_round_trip_and_cache_hit(device, cache_dir, monkeypatch):
    assert DeviceProfile.from_json(device.to_json()) == device
    import sparta_explore.device as mod

    def boom(*a, **k):
        raise AssertionError("a cached profile must not be measured again")

    monkeypatch.setattr(mod, "measure_profile", boom)
    assert DeviceProfile.load_or_measure(quick=True, cache_dir=cache_dir) == device


def test_cache_key_depends_on_the_reference_problem():
    assert machine_key(ProfileShape(quick=True)) != machine_key(ProfileShape())


def test_a_torn_profile_file_is_measured_again(device, cache_dir, monkeypatch):
    import sparta_explore.device as device_module

    shape = ProfileShape(quick=True)
    path = cache_dir / "device" / f"{machine_key(shape)}.json"
    good = path.read_text()
    try:
        path.write_text(good[: len(good) // 2])
        monkeypatch.setattr(device_module, "measure_profile", lambda shape, key, cache_dir: device)
        with pytest.warns(RuntimeWarning, match="is unreadable"):
            again = DeviceProfile.load_or_measure(quick=True, cache_dir=cache_dir)
        assert again == device
        assert DeviceProfile.from_json(path.read_text()) == device  # rewritten whole
    finally:
        path.write_text(good)


def test_a_settled_race_stops_after_its_first_rounds_and_a_close_one_runs_them_all():
    import time

    from sparta_explore import device as dev

    calls = {"fast": 0, "slow": 0, "near": 0}

    def sleeper(name, seconds):
        def fn(_):
            calls[name] += 1
            time.sleep(seconds)
        return fn

    ms = dev.fastest_ms({"fast": sleeper("fast", 0.001), "slow": sleeper("slow", 0.006)}, None, 6, settle=True)
    assert ms["fast"] < ms["slow"] and calls["fast"] == calls["slow"] == 1 + dev.SETTLE_ROUNDS  # warm-up + rounds
    calls.update(fast=0)
    dev.fastest_ms({"fast": sleeper("fast", 0.002), "near": sleeper("near", 0.002)}, None, 6, settle=True)
    assert calls["fast"] == calls["near"] == 1 + 6  # within SETTLE_MARGIN: every round
    calls.update(fast=0, slow=0)
    dev.fastest_ms({"fast": sleeper("fast", 0.001), "slow": sleeper("slow", 0.006)}, None, 6)
    assert calls["fast"] == 1 + 6  # without settle: every round
    calls.update(fast=0)
    dev.fastest_ms({"fast": sleeper("fast", 0.001)}, None, 6, settle=True)
    assert calls["fast"] == 2  # alone in a race: nothing to beat, one round after its warm-up
