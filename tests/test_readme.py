"""README's quickstart runs as written: its Python blocks, in order, against the package loaded by their own
`get_kernel` call (the session's local build: LOCAL_KERNELS, offline).

Only what a reader supplies is supplied here: `MyModel` (a small model of `nn.Linear` layers and an `lm_head`), its
input `x`, and the GPTQ layer `ckpt` and `w_ref` the importer lines take, written by tests/test_formats.py's independent
encoder. The blocks' sizes are scaled down (K 4096 -> 256, N 11008 -> 384) and `cuda` becomes this machine's device.
The results are then checked against float64 references, so a README whose API drifted from the package fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from test_formats import _gptq_checkpoint
from test_gemm import TOL, equal_but_ties, rtn_codes, rtn_scales, unpack_k_major

pytestmark = pytest.mark.kernels_ci

README = Path(__file__).resolve().parent.parent / "README.md"
K, N = 256, 384  # the blocks' 4096 and 11008


def quickstart_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Quickstart"):text.index("\n## ", text.index("## Quickstart") + 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def as_run_here(code: str, device: str) -> str:
    code = code.replace(".cuda()", f".to({device!r})").replace('device="cuda"', f"device={device!r}")
    return code.replace("4096", str(K)).replace("11008", str(N))


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(K, 2 * K)
        self.down = nn.Linear(2 * K, K, bias=False)
        self.lm_head = nn.Linear(K, 100, bias=False)

    def forward(self, x):
        return self.lm_head(self.down(torch.relu(self.up(x))))


def gptq_state_dict_of_my_model(gen) -> tuple[dict, dict]:
    """A GPTQ (v1, group 128) checkpoint of MyModel: its up and down layers quantized (test_formats' encoder), up's
    bias and the float lm_head as they would be stored; and each quantized layer's float64 weight [K, N]."""
    state_dict, refs = {}, {}
    for name, k, n in (("up", K, 2 * K), ("down", 2 * K, K)):
        tensors, refs[name] = _gptq_checkpoint(gen, k, n, 128, "v1")
        state_dict.update({f"{name}.{t}": v for t, v in tensors.items() if v is not None})
    state_dict["up.bias"] = (torch.randn(2 * K, generator=gen) * 0.1).half()
    state_dict["lm_head.weight"] = (torch.randn(100, K, generator=gen) * 0.05).half()
    return state_dict, refs


def test_readme_quickstart_runs(w4a16, device):
    blocks = quickstart_blocks()
    assert len(blocks) == 4, "README's quickstart: the model, the PDL lines, one layer, a whole checkpoint"
    assert 'get_kernel("w4a16-kernels/w4a16", version=1)' in blocks[0]
    torch.manual_seed(0)
    ckpt, gptq_ref = _gptq_checkpoint(torch.Generator().manual_seed(1), K, N, 128, "v1", act_order=True)
    x = torch.randn(2, K, device=device, dtype=torch.float16)
    state_dict, state_dict_refs = gptq_state_dict_of_my_model(torch.Generator().manual_seed(2))
    names = dict(MyModel=MyModel, x=x, w_ref=gptq_ref.t().to(device), print=lambda *a, **k: None,
                 ckpt={key: value.to(device) for key, value in ckpt.items()}, state_dict=state_dict,
                 config={"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                                 "desc_act": False, "sym": False, "checkpoint_format": "gptq"}})
    import torch._inductor.config as inductor
    saved_pdl = inductor.triton.enable_pdl  # (the PDL block sets this process-wide setting: put it back)
    try:
        exec(compile(as_run_here(blocks[0], device), str(README), "exec"), names)
        model = names["model"]  # every Linear but the skipped lm_head converted, and run
        assert [type(m).__name__ for m in (model.up, model.down, model.lm_head)] == ["W4A16Linear"] * 2 + ["Linear"]
        assert not model.up.pdl and names["y"].shape == (2, 100)
        # the PDL block converts "in place of the call above": on a fresh model
        names["model"] = MyModel().half().to(device)
        exec(compile(as_run_here(blocks[1], device), str(README), "exec"), names)
        model = names["model"]
        assert all(type(m).__name__ == "W4A16Linear" and m.pdl for m in (model.up, model.down))  # (lm_head: the default skip)
        exec(compile(as_run_here(blocks[2], device), str(README), "exec"), names)
        block_2_y = names["y"]
        exec(compile(as_run_here(blocks[3], device), str(README), "exec"), names)
    finally:
        inductor.triton.enable_pdl = saved_pdl
    names["y"] = block_2_y
    assert names["y"].shape == (2, N)

    # block 3: the quantized layer's output against x @ W in float64, W the block's float weight quantized here
    # (test_gemm's independent round-to-nearest quantizer), whose codes the block's packed weight holds
    weight = names["weight"].cpu()
    assert weight.shape == (K, N) and weight.dtype == torch.float32
    mine = rtn_codes(weight, 128, False, rtn_scales(weight, 128, False)[0])
    codes = unpack_k_major(names["packed"].cpu())
    assert bool(equal_but_ties(codes, mine["codes"], mine["code_tie"]).all())
    ref = x.double() @ mine["weight"].to(device)
    err = float((names["y"].double() - ref).norm() / ref.norm())
    assert err < TOL[torch.float16], err
    assert names["gptq"].act_order and (names["gptq"].in_features, names["gptq"].out_features) == (K, N)

    # block 4: the checkpoint's quantized layers imported exactly, the float lm_head loaded, and the model's output
    # against a float64 forward of the checkpoint's weights
    model = names["model"]
    assert [type(m).__name__ for m in (model.up, model.down, model.lm_head)] == ["W4A16Linear"] * 2 + ["Linear"]
    assert names["options"] == dict(checkpoint_format="gptq", group_size=128, zero_convention="v1", symmetric=False)
    assert names["summary"].converted == ["up", "down"] and list(names["summary"].skipped) == ["lm_head"]
    for name, ref in state_dict_refs.items():
        assert torch.equal(getattr(model, name).weight_view().dequantize().cpu(), ref)
    assert model.lm_head.weight.device.type == torch.device(device).type
    assert torch.equal(model.lm_head.weight.cpu(), state_dict["lm_head.weight"])
    up = x.double() @ state_dict_refs["up"].to(device) + state_dict["up.bias"].to(device).double()
    ref = torch.relu(up) @ state_dict_refs["down"].to(device) @ state_dict["lm_head.weight"].to(device).double().t()
    with torch.no_grad():  # (lm_head's weight, loaded with assign=True, is a Parameter that requires grad)
        err = float((model(x).double() - ref).norm() / ref.norm())
    assert err < TOL[torch.float16], err
