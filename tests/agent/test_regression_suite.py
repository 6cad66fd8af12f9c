"""The regression suite: recorded outputs of the real tools, parsed; the programs run as found;
bandwidths judged against the node's last passing run."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from node_agent.backends import diag_output
from node_agent.backends.amd import amd_tools
from node_agent.backends.nvml import NvmlBackend
from node_agent.backends.selftest import Tool, finder, nvidia_tools, run_self_test
from node_agent.protection.baseline import Baseline
from node_agent.uplink.pusher import Pusher
from tests.agent.test_loop import Clock, make_agent
from tests.fakes.fake_pynvml import FakeGpu, FakePynvml

FIXTURES = Path(__file__).parent / "fixtures" / "regression"


def recorded(path: str) -> str:
    return (FIXTURES / path).read_text(encoding="utf-8")


def outcomes(checks: list[diag_output.Check]) -> dict[str, str]:
    return {c.name: c.outcome for c in checks}


# -- parsers, on recorded outputs -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "parse", "outcome"),
    [
        ("nvidia/deviceQuery-a100.txt", diag_output.device_query, "pass"),
        ("nvidia/deviceQuery-h100-8gpu.txt", diag_output.device_query, "pass"),
        ("nvidia/deviceQuery-fail.txt", diag_output.device_query, "fail"),
        ("nvidia/vectorAdd-pass.txt", diag_output.vector_add, "pass"),
        ("nvidia/vectorAdd-fail.txt", diag_output.vector_add, "fail"),
        ("nvidia/bandwidthTest-pass-a100.txt", diag_output.bandwidth_test, "pass"),
        ("nvidia/bandwidthTest-fail.txt", diag_output.bandwidth_test, "fail"),
        ("nvidia/p2pBandwidthLatencyTest-8gpu-a100.txt", diag_output.p2p_bandwidth, "pass"),
        ("amd/rvs-gst.txt", diag_output.rvs, "pass"),
        ("amd/rvs-gst-legacy.txt", diag_output.rvs, "pass"),
        ("amd/rvs-iet.txt", diag_output.rvs, "pass"),
        ("amd/rvs-babel.txt", diag_output.rvs, "pass"),
        ("amd/rvs-pebb.txt", diag_output.rvs, "pass"),
        ("amd/rvs-pebb-legacy.txt", diag_output.rvs, "pass"),
        ("amd/rocm-bandwidth-test.txt", diag_output.rocm_bandwidth, "pass"),
        ("intel/xpu-smi-diag-l1.txt", diag_output.xpu_diag, "pass"),
        ("intel/xpu-smi-diag-singletest-1-4.txt", diag_output.xpu_diag, "pass"),
        ("intel/xpu-smi-diag-l1-fail.txt", diag_output.xpu_diag, "fail"),
        ("intel/xpu-smi-diag-singletest3-fail.txt", diag_output.xpu_diag, "pass"),
    ],
)
def test_each_recorded_output_is_read_as_the_tool_meant_it(fixture, parse, outcome):
    (check,) = parse("t", 0, recorded(fixture))
    assert check.outcome == outcome, check.detail


def test_a_zero_exit_without_the_success_line_is_not_a_pass():
    # The CUDA samples print their verdict; exit 0 alone proves nothing (these exited 0).
    (query,) = diag_output.device_query("q", 0, recorded("nvidia/deviceQuery-fail.txt"))
    assert "cudaGetDeviceCount returned 30" in query.detail
    (band,) = diag_output.bandwidth_test("b", 0, recorded("nvidia/bandwidthTest-fail.txt"))
    assert band.outcome == "fail" and "cudaGetDeviceProperties returned 35" in band.detail
    (passed,) = diag_output.vector_add("v", 1, recorded("nvidia/vectorAdd-pass.txt"))
    assert passed.outcome == "fail"  # the success line with a failing exit status


def test_bandwidth_test_gives_each_direction_in_gb_per_s():
    (check,) = diag_output.bandwidth_test("b", 0, recorded("nvidia/bandwidthTest-pass-a100.txt"))
    assert check.figures == {"h2d_gbps": 12.3, "d2h_gbps": 13.2, "d2d_gbps": 1157.5}
    assert check.detail == "h2d 12.3 GB/s, d2h 13.2 GB/s, d2d 1157.5 GB/s"


def test_p2p_gives_every_pair_of_an_eight_gpu_node():
    text = recorded("nvidia/p2pBandwidthLatencyTest-8gpu-a100.txt")
    (check,) = diag_output.p2p_bandwidth("p", 0, text)
    assert len(check.figures) == 28  # 8 choose 2
    assert check.figures["p2p_0_1_gbps"] == 416.29 and check.figures["p2p_4_5_gbps"] == 517.8
    assert "lowest" in check.detail
    (none,) = diag_output.p2p_bandwidth("p", 0, "P2P Connectivity Matrix\n")
    assert none.outcome == "fail"


def test_dcgmi_json_is_one_check_per_test_with_the_pcie_bandwidths():
    checks = diag_output.dcgmi("dcgm-diag-r2", 0, recorded("nvidia/dcgmi-diag-r2-dcgm3.json"))
    assert set(outcomes(checks).values()) == {"pass"}
    assert "dcgm-diag-r2/Page Retirement/Row Remap" in outcomes(checks)
    pcie = next(c for c in checks if c.name == "dcgm-diag-r2/PCIe")
    assert pcie.figures == {
        "pcie_gpu0_d2h_gbps": 13.15,
        "pcie_gpu0_h2d_gbps": 13.11,
        "pcie_gpu0_bidir_gbps": 22.49,
    }
    r3 = diag_output.dcgmi("dcgm-diag-r3", 0, recorded("nvidia/dcgmi-diag-r3-dcgm3.json"))
    assert outcomes(r3)["dcgm-diag-r3/Diagnostic"] == "pass"


def test_a_dcgm4_test_fails_on_any_gpu_and_says_why():
    text = recorded("nvidia/dcgmi-diag-r3-dcgm4-fragment.txt")
    test, _ = json.JSONDecoder().raw_decode(text[text.index("{") :])
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [test]}]}}
    (passed,) = diag_output.dcgmi("r3", 0, json.dumps(doc))
    assert passed.outcome == "pass"
    test["results"][3] = {**test["results"][3], "status": "Fail",
                          "warnings": [{"warning": "GPU 3 row remap pending", "error_id": 95}]}  # fmt: skip
    (failed,) = diag_output.dcgmi("r3", 226, json.dumps(doc))
    assert failed.outcome == "fail" and failed.detail == "GPU 3: GPU 3 row remap pending"


def test_dcgmi_tables_are_read_too_dcgm3_and_dcgm4():
    old = diag_output.dcgmi("r3", 0, recorded("nvidia/dcgmi-diag-r3-fail-dcgm3.txt"))
    assert outcomes(old)["r3/GPU Memory"] == "fail"
    assert outcomes(old)["r3/PCIe"] == "skipped"
    memory = next(c for c in old if c.name == "r3/GPU Memory")
    # Wrapped at a fixed width mid-word: joined back as DCGM wrote it.
    assert memory.detail.startswith(
        "GPU 0 Error using CUDA API cuInit Check DCGM and system logs for errors. Reset GPU. "
        "Restart DCGM. Rerun diagnostics. Unable to initialize CUDA library"
    )
    new = diag_output.dcgmi("r2", 0, recorded("nvidia/dcgmi-diag-r2-pcie-fail-dcgm4-b200.txt"))
    assert outcomes(new) == {"r2/software": "pass", "r2/memory": "pass", "r2/pcie": "fail"}
    assert "couldn't be parsed" in next(c for c in new if c.name == "r2/pcie").detail


def test_a_dcgmi_failure_exit_with_no_failed_test_still_fails():
    checks = diag_output.dcgmi("r1", 226, recorded("nvidia/dcgmi-diag-r1-dcgm3.json"))
    assert checks[-1].outcome == "fail" and "exit 226" in checks[-1].detail


def test_rvs_bandwidths_and_verdicts_in_both_output_formats():
    (new,) = diag_output.rvs("rvs", 0, recorded("amd/rvs-pebb.txt"))
    assert new.figures["pebb_gpu0000-05-00-0_cpu0_h2d_gbps"] == 57.678
    assert new.figures["pebb_gpu0000-05-00-0_cpu1_h2d_gbps"] == 54.034
    (old,) = diag_output.rvs("rvs", 0, recorded("amd/rvs-pebb-legacy.txt"))
    assert len(old.figures) == 12 and old.figures["pebb_gpu50599_cpu1_h2d_gbps"] == 10.292
    failing = recorded("amd/rvs-iet.txt").replace(
        "[GPU:: 17010] pass: TRUE", "[GPU:: 17010] pass: FALSE"
    )
    (failed,) = diag_output.rvs("rvs", 0, failing)
    assert failed.outcome == "fail" and "[GPU:: 17010] pass: FALSE" in failed.detail
    (silent,) = diag_output.rvs("rvs", 0, "ROCm Validation Suite\n")
    assert silent.outcome == "fail" and "no verdict" in silent.detail


def test_rocm_bandwidth_test_skips_what_it_could_not_measure():
    (check,) = diag_output.rocm_bandwidth("rbt", 0, recorded("amd/rocm-bandwidth-test.txt"))
    assert check.figures["rbt_uni_1_0_gbps"] == 14.28
    assert check.figures["rbt_bi_0_1_gbps"] == 25.911
    assert "rbt_uni_1_2_gbps" not in check.figures  # N/A: P2P did not work on that node
    assert "rbt_uni_1_1_gbps" not in check.figures  # a device to itself


def test_xpu_smi_diag_says_which_item_failed_and_a_missing_threshold_is_not_a_fault():
    (l1,) = diag_output.xpu_diag("x", 0, recorded("intel/xpu-smi-diag-l1-fail.txt"))
    assert l1.outcome == "fail"
    assert "Software Exclusive" in l1.detail and "2 process(es)" in l1.detail
    # "Fail ... Unconfigured or invalid threshold": xpu-smi had nothing to compare with. The
    # figure is kept; the node's last pass judges it.
    text = recorded("intel/xpu-smi-diag-singletest3-fail.txt")
    (bw,) = diag_output.xpu_diag("x", 0, text)
    assert bw.outcome == "pass"
    assert bw.figures == {"memory_gpu0_gbps": 410.609, "memory_gpu1_gbps": 410.054}


def test_an_output_that_says_nothing_the_parser_knows_is_a_failure():
    for text in ("", "Error: unable to establish a connection to the specified host: localhost"):
        (check,) = diag_output.dcgmi("dcgm", 0, text)
        assert check.outcome == "fail" and "no dcgmi diag result" in check.detail
    # A preamble with a brace before the document, and text after it.
    doc = recorded("nvidia/dcgmi-diag-r1-dcgm3.json")
    checks = diag_output.dcgmi("dcgm", 0, "note {not json}\n" + doc + "\ntrailing")
    assert len(checks) == 9 and {c.outcome for c in checks} == {"pass"}


def test_device_query_seeing_fewer_gpus_than_nvml_fails():
    text = recorded("nvidia/deviceQuery-a100.txt")
    (one,) = diag_output.device_query("q", 0, text, expected=2)
    assert one.outcome == "fail" and one.detail == "1 CUDA device(s) of 2 GPUs"


# -- programs run as found ------------------------------------------------------------------


def program(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def assert_gone(pid: int, why: str) -> None:
    """The process ``pid`` ends within 5 s."""
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(why)


def replay(folder: Path, name: str, fixture: str, code: int = 0) -> None:
    program(folder, name, f"cat '{FIXTURES / fixture}'\nexit {code}")


def test_the_nvidia_suite_grows_with_the_level_and_the_cuda_programs_see_nvmls_gpus(tmp_path):
    replay(tmp_path, "deviceQuery", "nvidia/deviceQuery-h100-8gpu.txt")
    replay(tmp_path, "vectorAdd", "nvidia/vectorAdd-pass.txt")
    program(tmp_path, "bandwidthTest", f'echo "$CUDA_VISIBLE_DEVICES $1" >> "{tmp_path}/asked"\n'
            f"cat '{FIXTURES / 'nvidia/bandwidthTest-pass-a100.txt'}'")  # fmt: skip
    replay(tmp_path, "p2pBandwidthLatencyTest", "nvidia/p2pBandwidthLatencyTest-8gpu-a100.txt")
    replay(tmp_path, "dcgmi", "nvidia/dcgmi-diag-r2-dcgm3.json")
    which = finder([tmp_path])
    uuids = ["GPU-aaaa", "GPU-bbbb"]
    for level, more in [(1, set()), (2, {"bandwidthTest-gpu0", "bandwidthTest-gpu1"}),
                        (3, {"bandwidthTest-gpu0", "bandwidthTest-gpu1",
                             "p2pBandwidthLatencyTest"})]:  # fmt: skip
        tools = nvidia_tools(level, 2, uuids)
        doc = run_self_test(2, which=which, tools=tools, cuda=False, bandwidth=level >= 2)
        names = {c["name"] for c in doc["checks"] if "/" not in c["name"]}
        assert names == {"nvidia-smi", "deviceQuery", "vectorAdd"} | more
        assert doc["verdict"] == "pass", doc
    # Each GPU's bandwidth measured on that GPU alone, named by NVML's uuid.
    assert (tmp_path / "asked").read_text().split("\n")[:2] == [
        "GPU-aaaa --device=0",
        "GPU-bbbb --device=0",
    ]
    assert dict(tools[2].env) == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}


def test_a_level_that_asks_for_bandwidths_fails_where_none_could_be_measured(tmp_path):
    replay(tmp_path, "deviceQuery", "nvidia/deviceQuery-a100.txt")
    replay(tmp_path, "vectorAdd", "nvidia/vectorAdd-pass.txt")
    tools = nvidia_tools(2, 1)
    doc = run_self_test(1, which=finder([tmp_path]), tools=tools, cuda=False, bandwidth=True)
    assert doc["verdict"] == "fail"
    assert doc["checks"][-1]["name"] == "bandwidth"
    assert "--diag-path" in doc["checks"][-1]["detail"]


def test_a_tool_that_hangs_is_killed_with_its_children_at_the_timeout(tmp_path):
    program(tmp_path, "hangs", f"sleep 30 &\necho $! > '{tmp_path}/child'\nwait")
    started = time.monotonic()
    doc = run_self_test(
        1, which=finder([tmp_path]), tools=[Tool("hangs", ("hangs",))], cuda=False, timeout_s=1
    )
    assert time.monotonic() - started < 20
    (check,) = doc["checks"]
    assert check["outcome"] == "fail" and "timed out after 1 s" in check["detail"]
    assert_gone(int((tmp_path / "child").read_text()), "the tool's child outlived the timeout")


def test_a_tool_that_exits_leaving_a_child_on_its_output_is_not_waited_for(tmp_path):
    program(tmp_path, "leaves", "sleep 30 &\necho Test PASSED\nexit 0")
    started = time.monotonic()
    doc = run_self_test(
        1, which=finder([tmp_path]), tools=[Tool("leaves", ("leaves",), diag_output.vector_add)],
        cuda=False, timeout_s=60,
    )  # fmt: skip
    assert time.monotonic() - started < 20  # the group is killed once the tool exits
    assert doc["checks"][0]["outcome"] == "pass"


def test_only_the_end_of_a_huge_output_is_kept(tmp_path):
    program(tmp_path, "chatty", "head -c 30000000 /dev/zero | tr '\\0' x\necho\necho Test PASSED")
    doc = run_self_test(
        1, which=finder([tmp_path]), tools=[Tool("chatty", ("chatty",), diag_output.vector_add)],
        cuda=False,
    )  # fmt: skip
    assert doc["checks"][0]["outcome"] == "pass"


def test_a_parser_that_breaks_fails_its_check_and_keeps_the_rest(tmp_path):
    program(tmp_path, "odd", "echo odd")

    def broken(name: str, code: int, text: str) -> list[diag_output.Check]:
        raise KeyError("surprise")

    doc = run_self_test(
        1,
        which=finder([tmp_path]),
        tools=[Tool("odd", ("odd",), broken), Tool("ok", ("odd",))],
        cuda=False,
    )
    assert [(c["name"], c["outcome"]) for c in doc["checks"]] == [("odd", "fail"), ("ok", "pass")]
    assert "output not understood" in doc["checks"][0]["detail"]


def test_the_amd_suite_runs_the_validation_suite_level_from_level_two(tmp_path):
    assert [t.name for t in amd_tools(1)] == ["amd-smi", "rvs-gpus"]
    assert [t.argv for t in amd_tools(2)][2:] == [("rvs", "-r", "2"), ("rocm-bandwidth-test",)]
    replay(tmp_path, "rvs", "amd/rvs-pebb.txt")
    replay(tmp_path, "rocm-bandwidth-test", "amd/rocm-bandwidth-test.txt")
    program(tmp_path, "amd-smi", "echo GPU: 0")
    doc = run_self_test(1, which=finder([tmp_path]), tools=amd_tools(2), cuda=False)
    assert doc["verdict"] == "pass"
    assert doc["checks"][2]["figures"]["pebb_gpu0000-05-00-0_cpu0_h2d_gbps"] == 57.678


def nvml(*gpus: FakeGpu) -> NvmlBackend:
    b = NvmlBackend(module=FakePynvml(list(gpus)), tool_dirs=[])
    b.open()
    return b


def test_nvml_fails_a_gpu_whose_rows_or_pages_wait_for_a_reset():
    ok = FakeGpu(uuid="GPU-a")
    pending = FakeGpu(uuid="GPU-b", remapped_rows=(0, 2, 1, 0))
    failed = FakeGpu(uuid="GPU-c", remapped_rows=(0, 9, 0, 1))
    narrow = FakeGpu(uuid="GPU-d")  # a link trained down is the bandwidth tests' to judge
    retired = FakeGpu(uuid="GPU-e", retired_pending=1, not_supported={"nvmlDeviceGetRemappedRows"})
    ecc = FakeGpu(uuid="GPU-f", ecc_uncorrected=3)
    old = FakeGpu(uuid="GPU-g", not_supported={"nvmlDeviceGetRemappedRows",
                  "nvmlDeviceGetRetiredPagesPendingStatus"})  # fmt: skip
    doc = nvml(ok, pending, failed, narrow, retired, ecc, old).self_test(1)
    library = {c["name"]: (c["outcome"], c["detail"]) for c in doc["checks"]
               if c["name"].startswith("library-")}  # fmt: skip
    assert library == {
        "library-gpu0": ("pass", ""),
        "library-gpu1": ("fail", "row remapping pending: the GPU needs a reset"),
        "library-gpu2": ("fail", "row remapping failed: the GPU needs service"),
        "library-gpu3": ("pass", ""),
        "library-gpu4": ("fail", "retired pages pending: the GPU needs a reset"),
        "library-gpu5": ("fail", "3 uncorrectable ECC error(s)"),
        "library-gpu6": ("pass", ""),  # not supported: nothing to say, not a failure
    }
    assert doc["verdict"] == "fail"


def test_a_lost_gpu_fails_its_library_check():
    lost = FakeGpu(uuid="GPU-z")
    b = nvml(FakeGpu(uuid="GPU-y"), lost)
    lost.lost = True
    checks = {c["name"]: c for c in b.self_test(1)["checks"]}
    assert checks["library-gpu1"]["outcome"] == "fail"
    assert "lost" in checks["library-gpu1"]["detail"]


# -- the node's own last passing run ----------------------------------------------------------


def verdict(**figures: dict[str, float]) -> dict[str, Any]:
    checks = [
        {"name": name, "outcome": "pass", "detail": "", "figures": f} for name, f in figures.items()
    ]
    return {"verdict": "pass", "reason": "", "checks": checks}


GPUS = ["GPU-a", "GPU-b"]


def test_a_bandwidth_drop_beyond_the_threshold_fails_against_the_last_pass(tmp_path):
    base = Baseline(tmp_path, drop_pct=20)
    first = base.judge(verdict(bw0={"h2d_gbps": 24.0, "d2h_gbps": 25.0}), GPUS)
    assert first["verdict"] == "pass" and first["baseline"] == {"compared": 0, "since": None}
    near = base.judge(verdict(bw0={"h2d_gbps": 21.0, "d2h_gbps": 25.5}), GPUS)
    assert near["verdict"] == "pass" and near["baseline"]["compared"] == 2
    slow = base.judge(verdict(bw0={"h2d_gbps": 12.0, "d2h_gbps": 25.5}), GPUS)
    assert slow["verdict"] == "fail"
    assert slow["checks"][0]["detail"] == (
        "h2d 12 GB/s is 43% below this node's last pass (21 GB/s)"
    )
    # A failing run is not a new record: the next is still judged against 21 GB/s.
    again = base.judge(verdict(bw0={"h2d_gbps": 16.0, "d2h_gbps": 25.5}), GPUS)
    assert again["verdict"] == "fail"


def test_a_bandwidth_measured_at_the_last_pass_and_missing_now_fails(tmp_path):
    base = Baseline(tmp_path, drop_pct=20)
    base.judge(verdict(p2p={"p2p_0_1_gbps": 400.0, "p2p_0_2_gbps": 410.0}), GPUS)
    gone = base.judge(verdict(p2p={"p2p_0_1_gbps": 401.0}), GPUS)
    assert gone["verdict"] == "fail"
    assert "p2p_0_2 not measured, 410 GB/s at this node's last pass" in gone["checks"][0]["detail"]


def test_a_shorter_run_keeps_the_longer_runs_figures(tmp_path):
    base = Baseline(tmp_path, drop_pct=20)
    base.judge(verdict(level2={"h2d_gbps": 24.0}), GPUS)
    base.judge(verdict(level1={"devices": 2.0}), GPUS)
    assert base.judge(verdict(level2={"h2d_gbps": 10.0}), GPUS)["verdict"] == "fail"


def test_other_gpus_or_an_unreadable_record_start_over(tmp_path):
    base = Baseline(tmp_path, drop_pct=20)
    base.judge(verdict(bw0={"h2d_gbps": 24.0}), GPUS)
    swapped = base.judge(verdict(bw0={"h2d_gbps": 10.0}), ["GPU-a", "GPU-new"])
    assert swapped["verdict"] == "pass" and swapped["baseline"]["compared"] == 0
    (tmp_path / "self-test-baseline.json").write_text("{not json", encoding="utf-8")
    assert base.judge(verdict(bw0={"h2d_gbps": 5.0}), GPUS)["verdict"] == "pass"


def test_no_threshold_compares_nothing_and_no_folder_keeps_nothing(tmp_path):
    off = Baseline(tmp_path, drop_pct=0)
    off.judge(verdict(bw0={"h2d_gbps": 24.0}), GPUS)
    assert off.judge(verdict(bw0={"h2d_gbps": 1.0}), GPUS)["verdict"] == "pass"
    nowhere = Baseline(None, drop_pct=20)
    nowhere.judge(verdict(bw0={"h2d_gbps": 24.0}), GPUS)
    assert nowhere.judge(verdict(bw0={"h2d_gbps": 1.0}), GPUS)["verdict"] == "pass"


def test_a_record_that_cannot_be_written_leaves_the_verdict_as_it_is(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")
    base = Baseline(blocked, drop_pct=20)  # its "folder" is a file
    assert base.judge(verdict(bw0={"h2d_gbps": 24.0}), GPUS)["verdict"] == "pass"


def test_a_failed_or_skipped_check_is_not_compared_and_a_failed_run_keeps_nothing(tmp_path):
    base = Baseline(tmp_path, drop_pct=20)
    doc = verdict(bw0={"h2d_gbps": 24.0})
    doc["verdict"] = "fail"
    base.judge(doc, GPUS)
    assert not (tmp_path / "self-test-baseline.json").exists()


async def test_a_maintenance_validation_fails_when_the_bandwidth_fell_since_the_last_pass(
    tmp_path,
):
    """The agent's own loop: the ask from the extender, the suite, the node's record, the report."""
    tools = tmp_path / "tools"
    tools.mkdir()
    fast = recorded("nvidia/bandwidthTest-pass-a100.txt")
    slow = fast.replace("12.3", "6.1")  # host to device halved: a link trained down
    (tools / "out.txt").write_text(fast, encoding="utf-8")
    program(tools, "bandwidthTest", f"cat '{tools / 'out.txt'}'")
    answers: dict[str, Any] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"accepted": True, **answers})

    clock = Clock()
    backend = NvmlBackend(module=FakePynvml([FakeGpu(uuid="GPU-a")]), tool_dirs=[tools])
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(
            clock,
            backend=backend,
            pusher=Pusher(["http://x"], client, clock=clock),
            baseline=Baseline(tmp_path, drop_pct=20),
        )

        async def validate(request: str) -> dict[str, str]:
            answers["self_test"] = {"id": request, "level": 2}
            await agent.round()
            while agent.remediation.testing is not None or not agent.remediation.self_test:
                await asyncio.sleep(0.01)
            result = agent.remediation.self_test
            assert result["id"] == request
            return result

        assert (await validate("before"))["verdict"] == "pass"
        (tools / "out.txt").write_text(slow, encoding="utf-8")
        after = await validate("after")
        assert after["verdict"] == "fail"
        assert (
            "bandwidthTest-gpu0: h2d 6.1 GB/s is 50% below this node's last pass (12.3 GB/s)"
            in (after["detail"])
        )
        kept = json.loads((tmp_path / "self-test-baseline.json").read_text())
        assert kept["gpus"] == ["GPU-a"]
        assert kept["checks"]["bandwidthTest-gpu0"]["h2d_gbps"] == 12.3


def test_a_hostile_record_is_not_compared_and_does_not_stop_the_self_test(tmp_path):
    (tmp_path / "self-test-baseline.json").write_text("[" * 100_000, encoding="utf-8")
    base = Baseline(tmp_path, drop_pct=20)
    assert base.judge(verdict(bw0={"h2d_gbps": 24.0}), GPUS)["verdict"] == "pass"
    (tmp_path / "self-test-baseline.json").write_text(
        json.dumps({"gpus": GPUS, "checks": {"bw0": {"h2d_gbps": "fast", "d2h_gbps": -1}}}),
        encoding="utf-8",
    )
    assert base.judge(verdict(bw0={"h2d_gbps": 1.0}), GPUS)["verdict"] == "pass"


async def test_a_detail_that_is_not_utf8_still_rides_the_report(tmp_path):
    """A tool's JSON may escape a lone surrogate; the report must still encode."""
    tools = tmp_path / "tools"
    tools.mkdir()
    doc = json.loads(recorded("nvidia/dcgmi-diag-r1-dcgm3.json"))
    test = doc["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][0]
    test["results"] = [{"status": "Fail", "warning": "bad \ud800 byte"}]
    (tools / "out.json").write_text(json.dumps(doc), encoding="utf-8")
    program(tools, "dcgmi", f"cat '{tools / 'out.json'}'")
    answers: dict[str, Any] = {"self_test": {"id": "t1"}}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"accepted": True, **answers})

    clock = Clock()
    backend = NvmlBackend(module=FakePynvml([FakeGpu(uuid="GPU-a")]), tool_dirs=[tools])
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        agent = make_agent(clock, backend=backend, pusher=Pusher(["http://x"], client, clock=clock))
        await agent.round()
        while agent.remediation.testing is not None or not agent.remediation.self_test:
            await asyncio.sleep(0.01)
        result = await agent.round()
        assert result.report.self_test is not None
        assert result.report.self_test.verdict == "fail"
        assert "bad ? byte" in result.report.self_test.detail


def test_closing_the_backend_stops_the_program_running_and_starts_no_other(tmp_path):
    import threading

    program(tmp_path, "long", f"sleep 30 &\necho $! > '{tmp_path}/child'\nwait")
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    doc = run_self_test(
        1, which=finder([tmp_path]), cuda=False, stop=stop,
        tools=[Tool("long", ("long",)), Tool("next", ("long",))],
    )  # fmt: skip
    assert time.monotonic() - started < 20
    assert [(c["name"], c["outcome"], c["detail"]) for c in doc["checks"]] == [
        ("long", "fail", "stopped: the agent is stopping"),
        ("next", "fail", "not run: the agent is stopping"),
    ]
    assert_gone(int((tmp_path / "child").read_text()), "the program's child outlived the stop")


def test_a_suite_past_its_time_fails_what_it_could_not_run(tmp_path):
    program(tmp_path, "slow", "sleep 2\necho Test PASSED")
    doc = run_self_test(
        1, which=finder([tmp_path]), cuda=False, budget_s=1.0,
        tools=[Tool("slow", ("slow",), diag_output.vector_add), Tool("after", ("slow",))],
    )  # fmt: skip
    outcomes_ = [(c["name"], c["outcome"]) for c in doc["checks"]]
    assert outcomes_ == [("slow", "fail"), ("after", "fail")]
    assert doc["checks"][1]["detail"] == "not run: the suite's time is spent"


def test_a_program_others_may_replace_is_not_run(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    program(shared, "deviceQuery", "echo Result = PASS")
    shared.chmod(0o777)  # anyone may put a program here
    assert finder([shared])("deviceQuery") is None
    shared.chmod(0o755)
    (shared / "deviceQuery").chmod(0o777)  # anyone may rewrite it
    assert finder([shared])("deviceQuery") is None
    (shared / "deviceQuery").chmod(0o755)
    assert finder([shared])("deviceQuery") == str(shared / "deviceQuery")


def test_a_check_that_measured_bandwidths_and_is_skipped_now_fails(tmp_path):
    base = Baseline(tmp_path, drop_pct=20)
    base.judge(verdict(bw0={"h2d_gbps": 24.0}, dq={"devices": 1.0}), GPUS)
    doc = verdict(dq={"devices": 1.0})
    doc["checks"].append({"name": "bw0", "outcome": "skipped", "detail": "bandwidthTest not found",
                          "figures": {}})  # fmt: skip
    judged = base.judge(doc, GPUS)
    assert judged["verdict"] == "fail"
    assert judged["checks"][1]["outcome"] == "fail"
    assert "not run (bandwidthTest not found)" in judged["checks"][1]["detail"]


def test_versions_are_cut_and_cleaned_before_they_reach_the_report():
    from node_agent.model import version_text

    assert version_text(b"570.86.15\x00") == "570.86.15"
    assert version_text("6.8\x1b[31m.5") == "6.8[31m.5"
    assert version_text("x" * 100) == "x" * 64
    assert version_text("bad \ud800") == "bad ?"
    assert version_text("N/A") is None and version_text("  ") is None and version_text(None) is None
