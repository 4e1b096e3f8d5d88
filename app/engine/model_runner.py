"""Turns a scheduled step into one flattened forward pass over the paged KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from app.config import EngineConfig
from app.engine.block_tables import BlockTables
from app.engine.cuda_graphs import MultiTokenSteps
from app.engine.step_inputs import DeviceInputs, GraphDraws, StepArrays
from app.engine.to_device import to_device
from app.engine.request import Request
from app.engine.selection.layout import RowLayout
from app.engine.selection.prompt_logprobs import PromptRows
from app.models.config import ModelConfig
from app.models.layer_ops import select_layer_ops
from app.models.loader import load_model
from specserve_kernels.attention_interface import AttentionBackend
from specserve_kernels.torch_attention import TorchAttentionBackend


def select_attention_backend(name: str, device: torch.device, dtype: torch.dtype = torch.float32
                             ) -> AttentionBackend:
    """auto: Triton on CUDA; on the CPU the C++ kernel where it builds, else plain PyTorch."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "cpu"
    if name == "cpu":  # fp32 on the CPU, where the C++ kernels build
        from specserve_kernels.cpu import paged_attention_short
        from specserve_kernels.cpu.backend import CpuAttentionBackend
        kernel = paged_attention_short() if device.type == "cpu" and dtype == torch.float32 else None
        return CpuAttentionBackend(kernel) if kernel is not None else TorchAttentionBackend()
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        from specserve_kernels.backend import TritonAttentionBackend
        return TritonAttentionBackend.for_dtype(dtype)
    raise ValueError(f"unknown attention backend {name!r} (auto, cpu, torch, triton)")


@dataclass
class StepLogits:
    """The logits of a step's sampled rows; each row's argmax when a CUDA graph computed it
    with them, and each request's token when the graph chose it too (None otherwise:
    selection takes them itself)."""
    logits: torch.Tensor
    argmax: torch.Tensor | None = None
    chosen: torch.Tensor | None = None


def kv_block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * itemsize


def linear_kernel_batches() -> list[int]:
    """Batches that compile every variant of the Triton linear kernels that are on
    (`specserve_kernels/skinny_linear.py`, `specserve_kernels/gate_up_silu.py`; each names its own)."""
    from specserve_kernels import gate_up_silu, skinny_linear
    return sorted(skinny_linear.warm_up_batches() | gate_up_silu.warm_up_batches())


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int,
                 multi_token: MultiTokenSteps | None = None):
        """multi_token: the steps of several query tokens per sequence that get CUDA graphs
        beside plain decode (a target's verifying steps, a draft's tails), on CUDA."""
        self.config = config
        self.device = config.torch_device
        self.dtype = config.torch_dtype
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        self.model = load_model(config.model, self.dtype, self.device)
        self.backend = select_attention_backend(config.attention_backend, self.device, self.dtype)
        self.model.ops = select_layer_ops(self.device, self.backend)
        triton_on_cuda = self.model.ops.name == "triton"  # CUDA with the Triton attention backend
        if triton_on_cuda:
            from specserve_kernels import skinny_linear
            if skinny_linear.ENABLED:
                skinny_linear.use_skinny_linears(self.model)
        if self.backend.name == "cpu":
            from specserve_kernels.cpu.packed_linear import pack_linears, packing_available
            if packing_available():
                pack_linears(self.model)
        self.num_blocks = config.num_kv_blocks or int(
            config.kv_cache_memory_gib * 2**30 // kv_block_bytes(model_config, self.block_size, self.dtype))
        shape = (2, self.num_blocks, self.block_size, model_config.num_key_value_heads, model_config.head_dim)
        # Zeros, not garbage: the CPU decode path reads padding slots under a mask, and a masked
        # NaN would still poison the sum. (Kernel tests fill unused blocks with NaN themselves.)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                          for _ in range(model_config.num_hidden_layers)]
        max_blocks_per_seq = -(-max_model_len // self.block_size) + 1
        if self.device.type == "cuda":  # every position a sequence's blocks can hold
            self.model.model.rotary_emb.tabulate(max_blocks_per_seq * self.block_size, self.dtype)
        self.cuda_graphs = None
        if triton_on_cuda and config.enable_cuda_graphs:
            from app.engine.cuda_graphs import CudaGraphDecodeRunner
            self.cuda_graphs = CudaGraphDecodeRunner(
                self.model, self.kv_caches, self.backend, max_batch_size=config.max_num_seqs,
                max_blocks_per_seq=max_blocks_per_seq, device=self.device, multi_token=multi_token)
        if triton_on_cuda:
            self.warm_up()

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Run the eager steps' Triton kernels once, so that Triton compiles them at start-up
        and not on the first request (a second or more each): the backend's warm-up shapes
        (on an H100 a first request of 3 prompts still compiled a prefill variant when only a
        5-token prompt was warmed, 2026-11-27). Every row is padding: its slots are -1, so no
        K/V is written, and what it reads is discarded. Then prompts of the batches that compile
        each variant of the Triton linear kernels that are on (`linear_kernel_batches`; CUDA
        graphs compile decode's at capture, not prefill's), with every row's logits: the
        lm_head's kernel too, where it takes one."""
        shapes = self.backend.warm_up_shapes(self.max_model_len)
        shapes += [(n, n) for n in linear_kernel_batches() if n <= self.max_model_len and (n, n) not in shapes]
        for query_len, seq_len in shapes:
            step = StepArrays(
                input_ids=np.zeros(query_len, dtype=np.int64),
                positions=np.arange(seq_len - query_len, seq_len, dtype=np.int64),
                slot_mapping=np.full(query_len, -1, dtype=np.int64),
                query_start_loc=np.array([0, query_len], dtype=np.int32),
                seq_lens=np.array([seq_len], dtype=np.int32),
                context_lens=np.array([seq_len - query_len], dtype=np.int32),
                block_tables=np.zeros((1, -(-seq_len // self.block_size)), dtype=np.int32),
                query_lens=[query_len], seq_lens_list=[seq_len], sample_rows=[query_len - 1])
            input_ids, positions, meta = step.to_device(self.device)
            self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, meta, self.backend), fp32=False)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks (source, destination) in every layer: copy on write of a block
        that forked beams share."""
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for cache in self.kv_caches:
            cache[:, dst] = cache[:, src]

    def prepare(self, scheduled: dict[Request, int], tables: BlockTables) -> StepArrays:
        """The step's inputs on the host. Per request only its new tokens are read; positions
        and slots are whole-batch array ops."""
        bs = self.block_size
        input_ids: list[int] = []
        sample_rows: list[int] = []
        for req, num_new in scheduled.items():
            start = req.num_computed_tokens
            end = start + num_new
            known = req.num_tokens
            if end <= known:
                input_ids += req.all_token_ids[start:end]
            else:  # the last known token and every draft after it
                input_ids += req.all_token_ids[start:known] + req.spec_token_ids[:end - known]
            if end >= known:
                sample_rows += range(len(input_ids) - (end - known + 1), len(input_ids))
        count = len(scheduled)
        query_lens = np.fromiter(scheduled.values(), dtype=np.int64, count=count)
        context_lens = np.fromiter((r.num_computed_tokens for r in scheduled), dtype=np.int64, count=count)
        seq_lens = context_lens + query_lens
        starts = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(query_lens, out=starts[1:])
        row = np.repeat(np.arange(count), query_lens)
        positions = np.arange(starts[-1]) - starts[row] + context_lens[row]
        block_table = tables.gather([r.request_id for r in scheduled])
        slots = block_table[row, positions // bs].astype(np.int64) * bs + positions % bs
        return StepArrays(
            input_ids=np.array(input_ids, dtype=np.int64), positions=positions, slot_mapping=slots,
            query_start_loc=starts.astype(np.int32), seq_lens=seq_lens.astype(np.int32),
            context_lens=context_lens.astype(np.int32), block_tables=block_table,
            query_lens=query_lens.tolist(), seq_lens_list=seq_lens.tolist(), sample_rows=sample_rows)

    @torch.inference_mode()
    def execute(self, scheduled: dict[Request, int], tables: BlockTables,
                prompt_rows: PromptRows | None = None, device_inputs: DeviceInputs | None = None,
                fp32_logits: bool = True, draws: GraphDraws | None = None) -> StepLogits:
        """Run the step; return logits (fp32, or the model's dtype when `fp32_logits` is False)
        for the requests whose known tokens are all computed after it, in batch order: one
        row, or 1 + k rows for a request verifying k draft tokens. The logits of
        `prompt_rows` follow them, when given. `draws`: how a CUDA graph may choose the
        tokens itself, where the step replays one with every row sampled."""
        step = self.prepare(scheduled, tables)
        rows = step.sample_rows if prompt_rows is None else step.sample_rows + prompt_rows.rows
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(step):
            every_row_sampled = rows == list(range(step.num_tokens))
            replayed = self.cuda_graphs.run(step, device_inputs, draws if every_row_sampled else None)
            if replayed.chosen is not None:  # selection reads no logits
                return StepLogits(replayed.logits, replayed.argmax, replayed.chosen)
            if replayed.logits is not None and every_row_sampled:
                logits = replayed.logits
                return StepLogits(logits.float() if fp32_logits else logits, replayed.argmax)
            logits = self._logits(replayed.hidden, rows)  # a draft's tails, a short prompt chunk
        else:
            input_ids, positions, meta = step.to_device(self.device, device_inputs)
            logits = self._logits(self.model(input_ids, positions, self.kv_caches, meta, self.backend), rows)
        return StepLogits(logits.float() if fp32_logits else logits)

    def _logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        return self.model.compute_logits(hidden.index_select(0, to_device(rows, self.device, torch.long)),
                                         fp32=False)

    def execute_with_layout(self, scheduled: dict[Request, int], tables: BlockTables,
                            device_inputs: DeviceInputs | None = None, unseeded_key: int = 0
                            ) -> tuple[StepLogits, RowLayout | None, PromptRows | None]:
        """`execute`, the layout of its logits rows that selection and the update read (None
        when the step only runs prompt chunks), and the prompt rows scored this step, whose
        logits are the last rows. `unseeded_key`: the key of this step's unseeded draws, for a
        CUDA graph that draws."""
        layout = RowLayout.build(scheduled, self.device)  # before the step moves num_computed_tokens
        prompt_rows = PromptRows.build(scheduled)
        fp32 = layout is not None and layout.needs_fp32_logits  # prompt logprobs cast their own rows
        draws = None
        if self.cuda_graphs is not None and layout is not None and prompt_rows is None:
            draws = layout.graph_draws(unseeded_key)
        return self.execute(scheduled, tables, prompt_rows, device_inputs, fp32, draws), layout, prompt_rows
