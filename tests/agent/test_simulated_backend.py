import pytest

from node_agent.backends import load_backend
from node_agent.backends.simulated import XID_REPEAT_S, SimulatedBackend
from node_agent.errors import BackendUnavailable, NotSupported


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(scenario="steady", **kw):
    clock = Clock()
    b = SimulatedBackend(clock=clock, scenario=scenario, scenario_after_s=20.0, **kw)
    b.open()
    return b, clock


def run(b, clock, seconds, step=5.0, index=0):
    last = None
    for _ in range(int(seconds / step)):
        clock.t += step
        last = b.read(index)
    return last


def test_the_same_seed_and_node_give_the_same_readings():
    a, ca = make(seed=3, node="n")
    b, cb = make(seed=3, node="n")
    assert [run(a, ca, 30).temperature_c for _ in range(3)] == [
        run(b, cb, 30).temperature_c for _ in range(3)
    ]
    c, cc = make(seed=4, node="n")
    assert run(c, cc, 30) != run(a, ca, 30)


def test_temperature_falls_after_a_power_cap():
    b, clock = make(load_pct=100.0, gpus=1)
    hot = run(b, clock, 300)
    b.set_power_limit_w(0, b.power_limits(0).min_w)
    capped = run(b, clock, 300)
    assert capped.power_w <= b.power_limits(0).min_w
    assert capped.temperature_c < hot.temperature_c - 3
    assert "sw_power_cap" in capped.throttle_reasons


def test_locked_low_clocks_lower_power():
    b, clock = make(load_pct=60.0, gpus=1)
    before = run(b, clock, 30)
    b.lock_clocks_mhz(0, 800)
    after = run(b, clock, 30)
    assert after.power_w < before.power_w
    assert after.sm_clock_mhz <= 800


def test_overheat_drives_gpu0_over_85_c():
    b, clock = make("overheat", gpus=2)
    assert run(b, clock, 400).temperature_c >= 85.0
    assert b.read(1).temperature_c < 85.0


def test_cabinet_overheat_drives_every_gpu_over_85_c():
    b, clock = make("cabinet-overheat", gpus=3)
    for _ in range(80):  # 400 s, every GPU sampled every 5 s as the agent does
        clock.t += 5.0
        temps = [b.read(i).temperature_c for i in range(3)]
    assert min(temps) >= 85.0, temps


def test_gpu_lost_loses_the_last_gpu_after_the_fault_time():
    b, clock = make("gpu-lost", gpus=2)
    assert not b.read(1).lost
    clock.t += 25
    assert b.read(1).lost and not b.read(0).lost


def test_xid_79_and_ecc_happen_once_the_fault_starts():
    b, clock = make("xid-79")
    assert b.poll_xids(clock.t) == []
    clock.t += 21
    assert [(e.index, e.xid) for e in b.poll_xids(clock.t)] == [(0, 79)]
    assert b.poll_xids(clock.t) == []
    e, ce = make("ecc")
    ce.t += 21
    assert e.read(0).ecc_uncorrected == 2


def test_xid_79_is_raised_again_while_the_fault_lasts_however_long_that_is():
    b, clock = make("xid-79")
    clock.t += 21
    raised = []
    for _ in range(3600):  # an hour of one-second polls
        raised += [(round(clock.t - 121.0), e.xid) for e in b.poll_xids(clock.t)]
        clock.t += 1.0
    assert raised == [(int(k * XID_REPEAT_S), 79) for k in range(60)]


def test_a_passing_self_test_resets_the_xid_79_gpu_and_a_restart_faults_it_again():
    b, clock = make("xid-79", gpus=2)
    clock.t += 21
    assert b.poll_xids(clock.t)
    assert b.self_test()["verdict"] == "pass"
    for _ in range(10):
        clock.t += XID_REPEAT_S
        assert b.poll_xids(clock.t) == []
    b.open()  # the agent restarts: the scenario starts over
    clock.t += 21
    assert [e.xid for e in b.poll_xids(clock.t)] == [79]


def test_a_self_test_before_the_xid_does_not_stop_it():
    b, clock = make("xid-79")
    assert b.self_test()["verdict"] == "pass"
    clock.t += 21
    assert [e.xid for e in b.poll_xids(clock.t)] == [79]


def test_unsupported_fields_are_none_and_setters_refuse():
    b, _ = make("unsupported-fields")
    r = b.read(0)
    assert r.power_w is None and r.sm_clock_mhz is None and r.temperature_c is not None
    assert b.power_limits(0) is None
    with pytest.raises(NotSupported):
        b.set_power_limit_w(0, 50)


def test_unknown_backends_and_scenarios_name_the_choices():
    with pytest.raises(BackendUnavailable, match="available: amd, intel, jetson, nvml, simulated"):
        load_backend("level-zero")
    with pytest.raises(BackendUnavailable, match="steady"):
        SimulatedBackend(clock=Clock(), scenario="meltdown")


def test_pod_processes_come_from_the_file_and_a_bad_file_means_none(tmp_path, caplog):
    procs = tmp_path / "processes.json"
    b = SimulatedBackend(clock=lambda: 0.0, gpus=2, model="Tesla T4", load_pct=0.0,
                         pod_processes=procs)  # fmt: skip
    b.open()
    assert b.read(0).processes == () and b.capabilities(0).processes  # no file yet
    procs.write_text('{"1": [{"pod_uid": "uid-p", "used_mib": 1000, "container": "c"}]}')
    r = b.read(1)
    assert [(p.pod_uid, p.used_mib, p.container) for p in r.processes] == [("uid-p", 1000.0, "c")]
    assert r.memory_used_mib == 1300.0  # the driver's 300 MiB and the pod's
    procs.write_text('{"1": [{"pod_uid": "uid-p", "used_mib": 99000}]}')
    assert b.read(1).memory_used_mib == 15360.0  # never more than the GPU has
    caplog.clear()
    for bad in ('{"0": [{"pod_uid": "a", "used_mib": 1}], "1": [{"pod_uid": "b", "used_mib": -5}]}',
                '{"0": [{"pod_uid": "a", "used_mib": "NaN"}]}', "[]", "{"):  # fmt: skip
        procs.write_text(bad)
        assert b.read(0).processes == () and b.read(1).processes == ()  # the whole file, not part
        assert b.read(0).processes == ()
    warnings = [r for r in caplog.records if "simulated pod processes" in r.getMessage()]
    assert len(warnings) == 4  # once per bad version of the file, not once per read
