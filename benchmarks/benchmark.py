"""`kernels benchmark` entry (Kernel Hub convention): W4A16 GEMM at decode, batch and prefill sizes.

    kernels benchmark ./        (or: kernels benchmark w4a16-kernels/w4a16 --version 1)

The runner injects `self.kernel` (the loaded package) and `self.device`; each `verify_*` returns a
float reference that the runner compares with `self.out`. The full comparison against cuBLAS and
torch's int4 GEMM is benchmarks/bench_gemm.py.
"""

import torch

from kernels.benchmark import Benchmark


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

    def setup_decode(self):
        self._setup(1)

    def benchmark_decode(self):
        self._run()

    def verify_decode(self) -> torch.Tensor:
        return self._reference()

    def setup_batch16(self):
        self._setup(16)

    def benchmark_batch16(self):
        self._run()

    def verify_batch16(self) -> torch.Tensor:
        return self._reference()

    def setup_prefill(self):
        self._setup(1024)

    def benchmark_prefill(self):
        self._run()

    def verify_prefill(self) -> torch.Tensor:
        return self._reference()
