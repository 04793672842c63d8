"""The CPU runner: the model's inference forward on the CPU in float32 as flat layers over numpy arrays
(kernels/cpu.py's numba kernels around torch's attention), built from a model at load and the only code
that knows the storage it lays the weights out in.

`prepare(model)` (the loader calls it for a model wholly on the CPU) stores the weights as a CPU GEMM
reads them fastest (`layout`: each SwiGLU's gate and up joined in one storage, which only the runner
reads as one; the parameters become views of it), then, where the model and the kernel backend allow it
(`CPURunner.refusal`), builds the runner (`CPURunner`), attaches it as `model.runner` and compiles what a
step runs (a one-token forward). LLaDA2.forward hands a forward to the runner where it runs (`runs`:
float32 CPU activations, no autograd, the backend's CPU kernels on), else runs its modules, which know
nothing of the joined storage (they multiply their parameters, views or not).

A parameter change that gives the parameters new storage: `model.to(...)`, `.float()` and the like
(LLaDA2._apply tells the runner: `parameters_changed`) and `load_state_dict(..., assign=True)` (a hook
the runner registers) rebuild the runner from the new storage (or detach it, with a log line, where the
model no longer qualifies); values loaded in place are read as they are. A parameter whose storage was
replaced by hand (`p.data = ...`) is refused loudly at the next forward (RuntimeError), never run through
stale arrays nor silently sent to the modules.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import kernel_backend as backend
from .. import kernels
from ..kernels import cpu
from .llada2 import MLP, DecoderLayer, Experts, KVView, LLaDA2, SparseMoE

log = logging.getLogger(__name__)

# A SwiGLU's weights as the runner's kernels take them: (gate_up [G, C, 2I], down [G, I, C]), G groups
# (a dense MLP's one; the routed experts, then the shared one where joined), whose storage the
# parameters are views of after `layout`.
Joint = tuple[torch.Tensor, torch.Tensor]


class CPUWeights(NamedTuple):
    """A CPULayer's weights as its kernels take them: numpy views of the parameters' storage."""

    w_in: np.ndarray  # [C] the input norm's
    w_post: np.ndarray  # [C] the post-attention norm's
    w_qkv: np.ndarray  # [C, (H + 2K) * D]
    w_q: np.ndarray  # [D] the query norm's
    w_k: np.ndarray  # [D] the key norm's
    w_dense: np.ndarray  # [H * D, C]
    gate_up: np.ndarray  # [G, C, 2I]: each group's gate and up (the routed experts, then the shared one)
    down: np.ndarray  # [G, I, C]
    router: tuple  # cpu.mlp's router arguments (cpu.dense_router for a dense MLP: one group)


class CPULayer:
    """A DecoderLayer's inference forward on the CPU in float32, over numpy arrays: `cpu.attend` (the QKV
    GEMM, q/k norm and RoPE, the paged cache's write and gather), torch's attention (`attention_out`), then
    `cpu.mlp_attend` (the output projection with the residual, the post-attention norm, the router's GEMM,
    the routing and grouping by expert, the experts' GEMMs with SwiGLU, the weighted sum with the shared
    expert and the residual, the next layer's input norm and its `attend`), so between two attentions a
    step calls one kernel (the last layer: `cpu.mlp`, the final norm). With the backend's exact GEMM the
    products are torch's bit for bit; the norms, SiLU and sums agree within float32 rounding
    (tests/kernels/test_cpu_kernels.py). `weights` are numpy views of the layer's storage, made once."""

    def __init__(self, layer: DecoderLayer, joints: dict[nn.Module, Joint]):
        attention = layer.attention
        self.layer_idx = attention.layer_idx
        self.H, self.K = attention.n_head, attention.n_kv
        self.eps = layer.input_layernorm.eps
        self.expert_ids: np.ndarray | None = None  # the last forward's routing [N, A] (benchmarks read it)
        self.weights = self._weights(layer, joints)

    @staticmethod
    def _weights(layer: DecoderLayer, joints: dict[nn.Module, Joint]) -> CPUWeights | None:
        """The layer's kernel arguments; None where its SwiGLU weights are not views of `layout`'s joined
        storage (`joints`)."""
        attention, mlp = layer.attention, layer.mlp
        if isinstance(mlp, SparseMoE):
            experts, r = mlp.experts, mlp.gate
            joint = joints.get(mlp)  # the shared expert joined as the last group
            if joint is None and mlp.shared_experts is None:  # no shared expert: the routed experts' own storage
                joint = joints.get(experts)
            params = [experts.w_gate, experts.w_up, experts.w_down]
            if mlp.shared_experts is not None:
                params += list(mlp.shared_experts.parameters())
            router = (cpu.array(r.weight).T, cpu.array(r.expert_bias), r.n_group, r.topk_group, r.top_k, r.scale,
                      r.normalise, mlp.shared_experts is not None)  # fmt: skip
        else:
            joint, params = joints.get(mlp), list(mlp.parameters())
            router = None if joint is None else cpu.dense_router(joint[0].shape[1])
        if joint is None or not all(w.is_contiguous() for w in joint) or not views_of(joint, params):
            return None
        return CPUWeights(cpu.array(layer.input_layernorm.weight), cpu.array(layer.post_attention_layernorm.weight),
                          cpu.array(attention.query_key_value.weight.T), cpu.array(attention.query_layernorm.weight),
                          cpu.array(attention.key_layernorm.weight), cpu.array(attention.dense.weight.T),
                          cpu.array(joint[0]), cpu.array(joint[1]), router)  # fmt: skip

    def attend_args(self, cos: np.ndarray, sin: np.ndarray, B: int, host: tuple | None) -> tuple:
        """cpu.attend's arguments after the normed rows: this layer's weights, the RoPE rows cos / sin [B * T
        or T, R], and `host`'s pools and slots for this layer (KVView.host_pools; None: no paged cache)."""
        w = self.weights
        pools = () if host is None else (host[0][self.layer_idx], host[1][self.layer_idx], *host[2:])
        return (w.w_qkv, w.w_q, w.w_k, self.eps, cos, sin, self.H, self.K, B, *pools)

    def mlp_args(self) -> tuple:
        """cpu.mlp's arguments after x and the attention's output rows."""
        w = self.weights
        return w.w_dense, w.w_post, self.eps, w.gate_up, w.down, w.router

    def attention_out(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, allow: torch.Tensor | None,
                      kv: KVView | None, host: tuple | None) -> np.ndarray:  # fmt: skip
        """The attention of q [B, H, T, D] over the keys and values [B, K, S, D] (cpu.attend's) -> its
        output rows [B * T, H * D]. Without the paged cache (`host` None) a `kv` view's `update` takes this
        forward's keys and values and gives every visible one."""
        q, k, v = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)
        if host is None and kv is not None:
            k, v = kv.update(self.layer_idx, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allow, enable_gqa=self.K != self.H)  # [B, H, T, D]
        return out.transpose(1, 2).numpy().reshape(q.shape[0] * q.shape[2], -1)


def parameter_slots(model: nn.Module) -> list[tuple[dict, str]]:
    """Where each of the model's parameters is held (its module's parameter dict and its name): read on
    every forward by `fingerprint`, so a parameter object replaced in its module is seen as one whose
    storage was (a submodule replaced whole is not: `prepare` again after that)."""
    return [(m._parameters, name) for m in model.modules() for name, p in m._parameters.items() if p is not None]


def fingerprint(slots: list[tuple[dict, str]]) -> tuple[int, ...]:
    """Where every parameter's storage starts: what the runner's numpy views read. From the slots made
    once (`parameter_slots`): model.parameters() walks every module on each call, ~13 times the time
    (77 against 6 us a forward here, for the embedded model's 54 parameters)."""
    return tuple(params[name].data_ptr() for params, name in slots)


def views_of(joint: Joint, params: list[torch.Tensor]) -> bool:
    """Whether every one of `params` is a view of the joined storage (gate_up's or down's)."""
    storages = {t.untyped_storage().data_ptr() for t in joint}
    return all(p.untyped_storage().data_ptr() in storages for p in params)


class CPURunner:
    """The model's flat CPU forward (`forward`), built from a laid-out model (`prepare`)."""

    def __init__(self, model: LLaDA2, joints: dict[nn.Module, Joint]):
        self.model = model
        with torch.no_grad():  # (the storage is read for inference: no gradient reaches it through the runner)
            self.layers = [CPULayer(layer, joints) for layer in model.model.layers]
        if any(layer.weights is None for layer in self.layers):
            raise ValueError("a layer's weights are not in the CPU layout's storage: run cpu_runner.layout first")
        self.w_in = model.model.layers[0].input_layernorm.weight
        self.final = cpu.array(model.model.norm.weight)
        self.head = cpu.array(model.lm_head.weight.T)
        self.slots = parameter_slots(model)
        self.fingerprint = fingerprint(self.slots)
        self._hook = model.register_load_state_dict_post_hook(self._loaded)

    def detach(self) -> None:
        """The runner off the model (its hook removed; the modules run every forward until `prepare`)."""
        self._hook.remove()
        if self.model.runner is self:
            self.model.runner = None

    def parameters_changed(self) -> None:
        """LLaDA2._apply's call after `.to()`, `.float()`, `.cuda()`...: where the parameters' storage
        moved, the runner is built again from the new one (`prepare`: laid out again), or detached where
        the model no longer qualifies (its arrays would hold the old storage alive; a model moved to a GPU
        or to another dtype keeps the layout `.to()` gave it)."""
        if fingerprint(parameter_slots(self.model)) == self.fingerprint:
            return
        self.detach()
        reason = CPURunner.refusal(self.model)
        if reason is None:
            prepare(self.model)
        else:
            log.info("the CPU runner is detached: %s; the model's modules run", reason)

    def _loaded(self, model: nn.Module, incompatible) -> None:
        """load_state_dict's post hook: values copied in place are read as they are; parameters assigned
        (`assign=True`) are new storage, as after a `.to()`."""
        self.parameters_changed()

    @staticmethod
    def refusal(model: LLaDA2) -> str | None:
        """Why the runner cannot run `model` (None: it can): the backend's CPU kernels off, not float32 on
        one CPU, LLaDA2.2's block routing or FP8 experts (their modules' paths run)."""
        if not backend.current().cpu:
            return f"the CPU kernels are off ({backend.current().why})"
        if model.dtype != torch.float32 or model.device.type != "cpu" or model.hops:
            return "the model is not float32 on one CPU"
        if model.config.block_routing:
            return "LLaDA2.2's block routing runs in the modules"
        if any(
            isinstance(layer.mlp, SparseMoE) and type(layer.mlp.experts) is not Experts for layer in model.model.layers
        ):
            return "FP8 experts run in the modules"
        return None

    def runs(self, x: torch.Tensor) -> bool:
        """Whether this forward is the runner's: float32 CPU activations, no autograd (cpu.enabled), and
        not the Triton kernels' (their switch says yes on a CPU tensor only where a test forces it)."""
        return cpu.enabled(x) and not kernels.enabled(x)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor | None, kv: KVView | None,
                last_n: int | None) -> torch.Tensor | None:  # fmt: skip
        """LLaDA2.forward from the embeddings x [B, T, C], over numpy arrays, each layer norming the next
        one's input (the last, the final norm's). Refuses (RuntimeError) a model whose parameters moved
        since the runner was built and that was not rebuilt (a `.data` replaced by hand)."""
        if fingerprint(self.slots) != self.fingerprint:
            raise RuntimeError("the model's parameters moved since its CPU runner was built (a parameter's .data "
                               "replaced by hand?): call llada_lsp.model.cpu_runner.prepare(model) again")  # fmt: skip
        layers = self.layers
        B, T, C = x.shape
        # each position's row of the RoPE tables made once (the same numbers: a row is its position's own)
        cos, sin = (F.embedding(positions, table).numpy().reshape(-1, table.shape[1])
                    for table in self.model.rope_tables(positions.device))  # fmt: skip
        host = kv.host_pools() if kv is not None else None
        normed = cpu.rms_norm(x, self.w_in, layers[0].eps).view(B * T, C).numpy()
        x = x.view(B * T, C).numpy()
        final = self.final if last_n != 0 else None  # (none for a prefill)
        qkv = cpu.attend(normed, *layers[0].attend_args(cos, sin, B, host))
        for i, layer in enumerate(layers):  # an attention, then one kernel to the next layer's q, k and v
            attn = layer.attention_out(*qkv, allow, kv, host)
            if i + 1 < len(layers):
                x, layer.expert_ids, qkv = cpu.mlp_attend(
                    x, attn, *layer.mlp_args(), layers[i + 1].weights.w_in,
                    *layers[i + 1].attend_args(cos, sin, B, host))  # fmt: skip
            else:
                x, normed, layer.expert_ids = cpu.mlp(x, attn, *layer.mlp_args(), final)
        if last_n == 0:
            return None
        rows = normed if last_n is None or last_n == T else normed.reshape(B, T, C)[:, T - last_n :].reshape(-1, C)
        return torch.from_numpy(cpu.gemm(rows, self.head)).view(B, -1, self.model.config.vocab_size)


def prepare(model: nn.Module) -> CPURunner | None:
    """`layout`, then the runner attached as `model.runner` where `CPURunner.refusal` allows it (else
    None, said in one log line), warmed up (compiled or loaded from numba's cache). The loader calls it
    for a model wholly on the CPU; LLaDA2's _apply and load_state_dict call it again after a change."""
    joints = layout(model)
    if not isinstance(model, LLaDA2):
        return None
    backend.announce()
    if isinstance(model.runner, CPURunner):
        model.runner.detach()
    model.runner = None
    reason = CPURunner.refusal(model)
    if reason is not None:
        log.info("the CPU runner does not run this model: %s; its modules do", reason)
        return None
    model.runner = CPURunner(model, joints)
    cpu.warm_up(lambda: model(torch.zeros(1, 1, dtype=torch.long, device=model.device)))  # what a step runs
    if not backend.current().cpu:  # the warm-up failed: the kernels are off for the process
        model.runner.detach()
    return model.runner


def layout(model: nn.Module) -> dict[nn.Module, Joint]:
    """Stores the weights as a CPU GEMM reads them fastest, values and shapes unchanged: each matrix
    [out, in] becomes the transposed view of a contiguous [in, out] one (F.linear then multiplies by a
    contiguous right-hand side: about a quarter faster here at a step's shapes), and each SwiGLU's gate
    and up share one [in, 2 * inner] storage, which the runner's kernels multiply in one GEMM; a shared
    expert as wide as a routed one is stored as the routed experts' last (`joint_storage`). FP8 experts
    keep their layout. Saving copies every weight contiguous (loader.save_model). Returns the joined
    storage (Joint) of each MLP, each Experts and each SparseMoE whose shared expert was joined: the
    runner's, which the modules never read as such."""
    joints: dict[nn.Module, Joint] = {}
    gate_ups: dict[nn.Module, torch.Tensor] = {}
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, MLP):
                both = torch.cat([module.gate_proj.weight.T, module.up_proj.weight.T], dim=1)  # [C, 2I]
                inner = module.gate_proj.weight.shape[0]
                module.gate_proj.weight.data, module.up_proj.weight.data = both[:, :inner].T, both[:, inner:].T
                gate_ups[module] = both
            elif type(module) is Experts:
                both = torch.cat([module.w_gate.transpose(1, 2), module.w_up.transpose(1, 2)], dim=2)  # [E, C, 2I]
                inner = module.w_gate.shape[1]
                module.w_gate.data = both[:, :, :inner].transpose(1, 2)
                module.w_up.data = both[:, :, inner:].transpose(1, 2)
                module.w_down.data = module.w_down.transpose(1, 2).contiguous().transpose(1, 2)
                joints[module] = both, module.w_down.transpose(1, 2)
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.weight.is_contiguous():
                module.weight.data = module.weight.T.contiguous().T
        for module, both in gate_ups.items():  # (down's storage transposed just above)
            joints[module] = both[None], module.down_proj.weight.T[None]
        for module in model.modules():
            if isinstance(module, SparseMoE):
                joint = joint_storage(module)
                if joint is not None:  # (the experts' and the shared expert's own entries no longer hold)
                    joints[module] = joint
                    joints.pop(module.experts), joints.pop(module.shared_experts)
    return joints


def joint_storage(moe: SparseMoE) -> tuple[torch.Tensor, torch.Tensor] | None:
    """layout's storage for a sparse MoE whose one shared expert is as wide as a routed one: its weights
    become the routed experts' last group, so the CPU layer runs them all in the same two grouped GEMMs;
    the parameters become views of it, values unchanged. Returns (gate_up, down); None: not joined."""
    experts, shared = moe.experts, moe.shared_experts
    E, I, C = experts.w_gate.shape
    if shared is None or type(experts) is not Experts or tuple(shared.gate_proj.weight.shape) != (I, C):
        return None
    gate_up = torch.empty(E + 1, C, 2 * I, dtype=experts.w_gate.dtype, device=experts.w_gate.device)
    down = torch.empty(E + 1, I, C, dtype=experts.w_down.dtype, device=experts.w_down.device)
    gate_up[:E, :, :I], gate_up[:E, :, I:] = experts.w_gate.transpose(1, 2), experts.w_up.transpose(1, 2)
    gate_up[E, :, :I], gate_up[E, :, I:] = shared.gate_proj.weight.T, shared.up_proj.weight.T
    down[:E], down[E] = experts.w_down.transpose(1, 2), shared.down_proj.weight.T
    experts.w_gate.data, experts.w_up.data = gate_up[:E, :, :I].transpose(1, 2), gate_up[:E, :, I:].transpose(1, 2)
    experts.w_down.data = down[:E].transpose(1, 2)
    shared.gate_proj.weight.data, shared.up_proj.weight.data = gate_up[E, :, :I].T, gate_up[E, :, I:].T
    shared.down_proj.weight.data = down[E].T
    return gate_up, down
