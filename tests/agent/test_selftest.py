import ctypes

from node_agent.backends.cuda_probe import CudaProbe
from node_agent.backends.selftest import nvidia_tools, run_self_test


class FakeLibcuda:
    """libcuda's four entry points, answering like the driver API (0 = CUDA_SUCCESS)."""

    def __init__(self, fail_create_on: set[int] | None = None) -> None:
        self.fail_create_on = fail_create_on or set()
        self.device = -1
        self.live = 0

    def cuInit(self, flags):
        return 0

    def cuDeviceGet(self, ref, ordinal):
        self.device = ordinal
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int)).contents.value = ordinal
        return 0

    def cuCtxCreate_v2(self, ref, flags, device):
        if self.device in self.fail_create_on:
            return 2  # CUDA_ERROR_OUT_OF_MEMORY
        self.live += 1
        return 0

    def cuCtxDestroy_v2(self, ctx):
        self.live -= 1
        return 0


def test_the_probe_creates_and_destroys_a_context_per_gpu_and_keeps_a_ratio():
    lib = FakeLibcuda(fail_create_on={1})
    probe = CudaProbe(window=4, loader=lambda name: lib)
    results = [probe.probe(i) for i in range(3)]
    assert [r.ok for r in results] == [True, False, True]
    assert "cuCtxCreate returned 2" in results[1].detail
    assert lib.live == 0
    assert probe.ratio() == 2 / 3


def test_without_libcuda_the_probe_says_so():
    def missing(name):
        raise OSError("not found")

    probe = CudaProbe(loader=missing)
    assert not probe.probe(0).ok and probe.ratio() is None


def test_self_test_passes_only_when_something_ran_and_nothing_failed():
    probe = CudaProbe(loader=lambda name: FakeLibcuda())
    tools = nvidia_tools(1, 2)
    verdict = run_self_test(2, probe=probe, which=lambda tool: None, tools=tools)
    assert verdict["verdict"] == "pass"
    assert [c["outcome"] for c in verdict["checks"]] == ["skipped"] * 4 + ["pass", "pass"]
    bad = run_self_test(
        2,
        probe=CudaProbe(loader=lambda name: FakeLibcuda({0})),
        which=lambda tool: None,
        tools=tools,
    )
    assert bad["verdict"] == "fail"
    nothing = run_self_test(
        1,
        probe=CudaProbe(loader=lambda n: (_ for _ in ()).throw(OSError())),
        which=lambda t: None,
        tools=tools,
    )
    assert nothing["verdict"] == "fail" and "nothing could be verified" in nothing["reason"]
