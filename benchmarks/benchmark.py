"""`kernels benchmark` entry (Kernel Hub convention): W4A16 GEMM at decode, batch and prefill sizes.

    kernels benchmark ./        (or: kernels benchmark w4a16-kernels/w4a16 --version 1)

The runner injects `self.kernel` (the loaded package) and `self.device`; each `verify_*` returns a
float reference that the runner compares with `self.out`. The full comparison against cuBLAS and
torch's int4 GEMM is benchmarks/bench_gemm.py.
"""

import torch

from kernels.benchmark import Benchmark


def _workload(m: int):
    """(setup, benchmark, verify) methods for a workload of M = m tokens."""

    def setup(self):
        self._setup(m)

    def benchmark(self):
        self._run()

    def verify(self) -> torch.Tensor:
        return self._reference()

    return setup, benchmark, verify


class W4A16GemmBenchmark(Benchmark):
    seed: int = 42
    N, K, GROUP = 4096, 4096, 128

    def _setup(self, m: int) -> None:
        w = torch.randn(self.K, self.N, device=self.device) * 0.02
        packed, scales, zeros = self.kernel.quantize_weight_int4_grouped(w, self.GROUP, False)
        self.weight = self.kernel.prepare_weight(packed, scales, zeros, self.GROUP)
        self.reference_weight = self.kernel.dequantize_int4_grouped(packed, scales, zeros, self.GROUP, torch.float32)
        self.x = torch.randn(m, self.K, device=self.device, dtype=torch.float16)
        self.out = torch.empty(m, self.N, device=self.device, dtype=torch.float16)

    def _run(self) -> None:
        self.out = self.kernel.w4a16_linear(self.x, self.weight)

    def _reference(self) -> torch.Tensor:
        return (self.x.float() @ self.reference_weight).half()

    # One workload per batch size: the runner finds setup_<name> / benchmark_<name> / verify_<name> by name.
    setup_decode, benchmark_decode, verify_decode = _workload(1)
    setup_batch16, benchmark_batch16, verify_batch16 = _workload(16)
    setup_prefill, benchmark_prefill, verify_prefill = _workload(1024)
