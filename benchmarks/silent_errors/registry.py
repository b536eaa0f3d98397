"""Every ported case, and every reproduction of the collection that is not ported, with the reason."""
from __future__ import annotations

from benchmarks.silent_errors.cases import Case
from benchmarks.silent_errors.ports_data import transfer_data_loss
from benchmarks.silent_errors.ports_ddp import ddp_wrapped_sometimes
from benchmarks.silent_errors.ports_loop import frozen_except_bn, frozen_stages_not_applied, missing_zero_grad
from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["CASES", "NOT_PORTED", "select"]

CASES = (
    Case("stackoverflow-60335387", "Stack Overflow 60335387 (MNIST CNN)",
         "optimizer.zero_grad() missing: gradients accumulate over all steps", ("stale_gradients",),
         missing_zero_grad),
    Case("pytorch-forum-84911", "PyTorch forum 84911 (EfficientNet transfer)",
         "every parameter frozen but BatchNorm's, then the head (the optimizer's only parameters) too",
         ("update_stagnation",), frozen_except_bn),
    Case("mmpretrain-702", "open-mmlab/mmpretrain #702 (VGG fine-tuning)",
         "frozen_stages applied only in train(), which the loop never calls: the frozen stage trains",
         ("wrong_mode",),
         frozen_stages_not_applied),
    Case("pytorch-84803", "pytorch/pytorch #84803 (+ #96600, baichuan2 #86; m2m100 translation)",
         "1 % of tensor transfers zeroed (faulty peer-to-peer link)", ("data_shift", "loss_spike"),
         transfer_data_loss),
    Case("x-jxmnop-ddp-out-of-sync", "jxmnop on X (BERT, HF Trainer, DDP)",
         "model wrapped in DDP on odd steps only: even steps never average gradients", ("rank_desync", "partial_ddp"),
         ddp_wrapped_sometimes, distributed=True),
)
"""The ported cases, in the order the runner runs them."""

NOT_PORTED = {
    "baichuan2-86": "the same fault as pytorch-84803 (data lost on a peer-to-peer link); the collection reproduces "
                    "it through pytorch-84803, ported",
    "pytorch-96600": "the same fault as pytorch-84803, ported",
    "deepspeed-1801": "the bug is in DeepSpeed 0.6.2's BF16_Optimizer gradient clipping under tensor parallelism "
                      "(Megatron-DeepSpeed on GPUs); nothing of it exists without DeepSpeed and CUDA",
    "deepspeed-5794": "a hang of DeepSpeed MoE all_to_all with uneven tokens, not a silent training error; needs "
                      "DeepSpeed (the collection has no reproduction either)",
    "lightning-thunder-725": "a regression inside lightning-thunder's autocast transformation; needs thunder and "
                             "a GPU mixed-precision path",
    "pytorch-104336": "needs CUDA: the bug is ddp_model.cpu(); ddp_model.cuda(rank) re-materialising the "
                      "parameters DDP hooked; without a GPU the move is a no-op (an in-place dtype round trip "
                      "breaks DDP's gradient averaging the same way on CPU, but that is not the original's code)",
    "pytorch-115607": "fixed in this torch: the original simple_buggy.py gives the same Adam step counts, "
                      "[1, 1, 2], eager and under torch._dynamo.optimize('eager') on torch 2.13",
    "stackoverflow-67180955": "fixed in torch 1.9 (pytorch #56488): the original bug.py gives 16 distinct rows "
                              "from 4 workers on torch 2.13",
    "pytorch-51800": "the effect is in an evaluation pass (spectral_norm evaluated before its first power "
                     "iteration); training computes the same in both variants",
    "transformers-17877": "the effect is slow model construction (weights initialised repeatedly); training "
                          "computes the same",
    "transformers-23723": "Whisper generation ignoring max_new_tokens: an inference bug",
    "transformers-33844": "dropout left on in evaluation by FlashAttention2: an inference bug (and flash-attn "
                          "needs a GPU)",
    "transformers-34204": "the Pixtral processor batching inputs wrongly: a preprocessing bug with no training "
                          "loop in the reproduction",
}
"""Reproductions of the collection that are not ported, and why."""


def select(names: str | None) -> tuple[Case, ...]:
    """The cases named in a comma-separated list (all when None); an unknown name raises
    ``InvalidArgumentError`` listing the known ones."""
    if not names:
        return CASES
    known = {c.name: c for c in CASES}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        hint = " (not ported: " + "; ".join(f"{n}: {NOT_PORTED[n]}" for n in unknown if n in NOT_PORTED) + ")" \
            if any(n in NOT_PORTED for n in unknown) else ""
        raise InvalidArgumentError(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(known)}{hint}")
    return tuple(known[n] for n in wanted)
