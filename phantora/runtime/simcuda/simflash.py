"""Simulated FlashAttention packages for ranks on a machine without them (each is a CUDA build).

A GPU host that trains on Hopper has FlashAttention 3, and programs switch on it: torchtitan activates torch's FA3
implementation on SM 9.0 (`activate_flash_attention_impl("FA3")`, which imports `flash_attn_interface` and needs its
ops ``torch.ops.flash_attn_3.fwd`` / ``bwd``), and HF transformers' `attn_implementation="flash_attention_2"` /
`"flash_attention_3"` import `flash_attn` / `flash_attn_interface` after checking their distributions' metadata. A
rank whose import finds nothing gets these instead:

- `flash_attn_interface` (distribution `flash-attn-3`): FA3's functions (flash_api.py), and the ops
  ``flash_attn_3::fwd`` / ``bwd`` with FA3's schemas, which torch's FA3 registration looks for. torch then routes
  its flash SDPA and `varlen_attn` to them on a real GPU; on the simulated one those run as torch's own flash ops
  (attention.py, varlen.py), charged as the same kernel.
- `flash_attn`, `flash_attn.flash_attn_interface` (distribution `flash-attn` 2.8.3): FA2's functions; and
  `flash_attn.bert_padding`'s `pad_input` / `unpad_input` / `index_first_axis`.

Every function computes on the data and is charged as the compute model's flash kernel (flash_kernels.py). The finder
sits last on `sys.meta_path`: an installed package is found first and never shadowed. A program that imports one is
told once, in the run's summary and in results.json (`simulated_packages`); one whose attention functions it never
called is named apart (`simulated_packages_unused`: e.g. Megatron-core try-imports `flash_attn` and may not use it).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from phantora.runtime.simcuda import flash_api, flash_kernels
from phantora.runtime.simcuda.last_resort import LastResort

FA2_VERSION = "2.8.3"
FA3_VERSION = "3.0.0"
_MODULES = {  # module: (is a package, distribution)
    "flash_attn_interface": (False, "flash-attn-3"),
    "flash_attn": (True, "flash-attn"),
    "flash_attn.flash_attn_interface": (False, "flash-attn"),
    "flash_attn.bert_padding": (False, "flash-attn"),
}
_DISTRIBUTIONS = {"flash-attn": (FA2_VERSION, "flash_attn"), "flash-attn-3": (FA3_VERSION, "flash_attn_interface")}
_imported: set[str] = set()
_called: set[str] = set()
_ops: list[torch.library.Library] = []


def _fa3_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_new: Any = None, v_new: Any = None, q_v: Any = None,
    out: Any = None, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None, cu_seqlens_k_new: Any = None,
    seqused_q: Any = None, seqused_k: Any = None, max_seqlen_q: Any = None, max_seqlen_k: Any = None,
    page_table: Any = None, kv_batch_idx: Any = None, leftpad_k: Any = None, rotary_cos: Any = None,
    rotary_sin: Any = None, seqlens_rotary: Any = None, q_descale: Any = None, k_descale: Any = None,
    v_descale: Any = None, softmax_scale: float | None = None, is_causal: bool = False, window_size_left: int = -1,
    window_size_right: int = -1, attention_chunk: int = 0, softcap: float = 0.0, is_rotary_interleaved: bool = False,
    scheduler_metadata: Any = None, num_splits: int = 0, pack_gqa: Any = None, sm_margin: int = 0,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """``flash_attn_3::fwd``: (out, softmax_lse, and FA3's split-KV accumulators, empty here)."""
    _called.add("flash-attn-3")
    flash_api._refuse(
        "flash_attn_3.fwd", k_new=k_new, v_new=v_new, q_v=q_v, cu_seqlens_k_new=cu_seqlens_k_new, seqused_q=seqused_q,
        seqused_k=seqused_k, page_table=page_table, kv_batch_idx=kv_batch_idx, leftpad_k=leftpad_k,
        rotary_cos=rotary_cos, q_descale=q_descale, attention_chunk=attention_chunk,
    )  # fmt: skip
    o, lse = flash_kernels.FORWARD(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, is_causal, window_size_left,
        window_size_right, softcap, True,
    )  # fmt: skip
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse, q.new_empty(0), lse.new_empty(0)


def _fa3_bwd(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor, dq: Any = None, dk: Any = None, dv: Any = None, cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None, seqused_q: Any = None, seqused_k: Any = None, max_seqlen_q: Any = None,
    max_seqlen_k: Any = None, softmax_scale: float | None = None, is_causal: bool = False, window_size_left: int = -1,
    window_size_right: int = -1, softcap: float = 0.0, deterministic: bool = False, sm_margin: int = 0,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """``flash_attn_3::bwd``: (dq, dk, dv, softmax_d, an empty accumulator); given dq / dk / dv are written."""
    _called.add("flash-attn-3")
    flash_api._refuse("flash_attn_3.bwd", seqused_q=seqused_q, seqused_k=seqused_k)
    grads = list(
        flash_kernels.BACKWARD(
            dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            is_causal, window_size_left, window_size_right, softcap,
        )
    )  # fmt: skip
    for i, given in enumerate((dq, dk, dv)):
        if given is not None:
            given.copy_(grads[i])
            grads[i] = given
    rows = (1, 2) if dout.dim() == 4 else (0, 1)  # rowsum(dO o O) as (batch, heads, seq) or (heads, total)
    softmax_d = (dout.float().transpose(*rows) * out.float().transpose(*rows)).sum(-1)
    return grads[0], grads[1], grads[2], softmax_d, q.new_empty(0, dtype=torch.float32)


_FA3_FWD = (
    "fwd(Tensor q, Tensor k, Tensor v, Tensor(k_new!)? k_new=None, Tensor(v_new!)? v_new=None, Tensor? q_v=None, "
    "Tensor(out!)? out=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? cu_seqlens_k_new=None, "
    "Tensor? seqused_q=None, Tensor? seqused_k=None, int? max_seqlen_q=None, int? max_seqlen_k=None, "
    "Tensor? page_table=None, Tensor? kv_batch_idx=None, Tensor? leftpad_k=None, Tensor? rotary_cos=None, "
    "Tensor? rotary_sin=None, Tensor? seqlens_rotary=None, Tensor? q_descale=None, Tensor? k_descale=None, "
    "Tensor? v_descale=None, float? softmax_scale=None, bool is_causal=False, int window_size_left=-1, "
    "int window_size_right=-1, int attention_chunk=0, float softcap=0.0, bool is_rotary_interleaved=False, "
    "Tensor? scheduler_metadata=None, int num_splits=0, bool? pack_gqa=None, int sm_margin=0) "
    "-> (Tensor(out!), Tensor, Tensor, Tensor)"
)
_FA3_BWD = (
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor(dq!)? dq=None, "
    "Tensor(dk!)? dk=None, Tensor(dv!)? dv=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
    "Tensor? seqused_q=None, Tensor? seqused_k=None, int? max_seqlen_q=None, int? max_seqlen_k=None, "
    "float? softmax_scale=None, bool is_causal=False, int window_size_left=-1, int window_size_right=-1, "
    "float softcap=0.0, bool deterministic=False, int sm_margin=0) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def _define_fa3_ops() -> None:
    """``flash_attn_3::fwd`` / ``bwd`` (FA3's schemas), each flash_kernels.py's op, unless FA3 defined them."""
    if _ops or hasattr(torch.ops.flash_attn_3, "fwd"):
        return
    lib = torch.library.Library("flash_attn_3", "DEF")
    lib.define(_FA3_FWD)
    lib.define(_FA3_BWD)
    lib.impl("fwd", _fa3_fwd, "CompositeImplicitAutograd")
    lib.impl("bwd", _fa3_bwd, "CompositeImplicitAutograd")
    _ops.append(lib)


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: Any = None) -> tuple:
    """(batch, seq, ...) rows kept by a (batch, seq) mask, packed: (rows, indices, cu_seqlens, max_seqlen,
    used_seqlens), flash_attn.bert_padding's."""
    mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = mask.sum(-1, dtype=torch.int32)
    used = attention_mask.sum(-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(seqlens, 0, dtype=torch.int32), (1, 0))
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:])[indices]
    return rows, indices, cu, int(seqlens.max().item()), used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Packed rows back to (batch, seqlen, ...), zeros where no row was kept (flash_attn.bert_padding's)."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The rows `indices` of x's first axis."""
    return x[indices]


def _recorded(functions: dict[str, Callable[..., Any]], distribution: str) -> dict[str, Callable[..., Any]]:
    """`functions`, each noting on its call that the program used `distribution` (`simulated_packages_unused`)."""

    def record(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def called(*args: Any, **kwargs: Any) -> Any:
            _called.add(distribution)
            return f(*args, **kwargs)

        return called

    return {name: record(f) for name, f in functions.items()}


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        _imported.add(_MODULES[name][1])
        module.__dict__["__phantora_simulated__"] = True
        if name == "flash_attn_interface":
            _define_fa3_ops()
            module.__dict__.update(_recorded(flash_api.FA3, "flash-attn-3"))
        elif name == "flash_attn.bert_padding":
            module.__dict__.update(unpad_input=unpad_input, pad_input=pad_input, index_first_axis=index_first_axis)
        else:
            module.__dict__.update(_recorded(flash_api.FA2, "flash-attn"), __version__=FA2_VERSION)


class _Distribution(importlib.metadata.Distribution):
    """A simulated package's metadata: its name, version and top-level module."""

    def __init__(self, name: str) -> None:
        self._name = name

    def read_text(self, filename: str) -> str | None:
        version, top = _DISTRIBUTIONS[self._name]
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: {self._name}\nVersion: {version}\n"
        return f"{top}\n" if filename == "top_level.txt" else None

    def locate_file(self, path: Any) -> Any:
        return None


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _Finder(LastResort):
    """The simulated modules, and the metadata of their distributions (HF's checks read it)."""

    def find_distributions(self, context: Any = None) -> Iterator[importlib.metadata.Distribution]:
        """The simulated distributions not installed for real (`importlib.metadata.version("flash-attn")`)."""
        wanted = getattr(context, "name", None)
        for name in _DISTRIBUTIONS:
            if wanted is not None and _normal(wanted) != name:
                continue
            if _installed(name):
                continue
            yield _Distribution(name)


def _installed(name: str) -> bool:
    """A real distribution `name` on sys.path (found by the other finders)."""
    for finder in sys.meta_path:
        if finder is _finder or not hasattr(finder, "find_distributions"):
            continue
        if any(True for _ in finder.find_distributions(importlib.metadata.DistributionFinder.Context(name=name))):
            return True
    return False


_finder = _Finder({name: package for name, (package, _) in _MODULES.items()}, _Loader())


def install() -> None:
    """Let `import flash_attn_interface` / `flash_attn` find the simulated ones when nothing else provides them
    (after every other finder)."""
    _finder.install()


def simulated_packages() -> list[str]:
    """The simulated distributions the program imported (results.json's `simulated_packages`)."""
    return sorted(_imported)


def unused_packages() -> list[str]:
    """The simulated distributions imported but none of whose attention functions ran (results.json's
    `simulated_packages_unused`); FA3's is used too once torch's FA3 activation had a forward charged as FA3's."""
    used = _called | ({"flash-attn-3"} if flash_kernels.varlen.charged_as_fa3() else set())
    return sorted(_imported - used)
