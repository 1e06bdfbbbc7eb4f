"""Watch the first steps of training: gradient scale, hidden-state norm and spread, and early perplexity.

Each ``--run NAME OVERRIDES`` builds the app's model from the config (as ``python -m lmtrain OVERRIDES`` would) and
trains it for ``--steps`` optimizer steps with the app's own recipe (loss summed or averaged over time as
``loss_reduction`` says, the configured optimizer, sparse-aware clipping, the output's after-step hook). Every
``--every`` steps it prints the encoder's and the output layer's gradient norms before clipping, the mean hidden
norm |h|, the fraction of saturated units (|h_i| > 0.95) and the mean pairwise cosine of the hidden states of one
window (1.0 = every position has the same hidden state). At the end it reports the exact perplexity on the first
``--val-tokens`` validation tokens.

    LMTRAIN_DATA_DIR=../shared/data python scripts/probe_training.py --steps 300 \\
        --run full "output=full" --run cos_exact "output=rff sampler=softmax output.norm_eps=0" --json probe.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import torch
import torch.nn.functional as F

from lmtrain.config import compose_config
from lmtrain.run.build import build_model
from lmtrain.training.step import Window, evaluate, train_step


def grad_norm(params: list[torch.nn.Parameter]) -> float:
    squares = [(p.grad.coalesce().values() if p.grad.is_sparse else p.grad).float().square().sum() for p in params]
    return math.sqrt(float(sum(squares))) if squares else 0.0


def hidden_stats(hidden: torch.Tensor) -> dict[str, float]:
    """Norm, saturation and mean pairwise cosine of hidden states (N, d) (up to 256 of them)."""
    sample = hidden[:256]
    unit = F.normalize(sample, dim=1)
    return {
        "h_norm": sample.norm(dim=1).mean().item(),
        "saturated": (sample.abs() > 0.95).float().mean().item(),
        "mean_cos": (unit @ unit.T).mean().item(),
    }


def probe(name: str, overrides: list[str], steps: int, every: int, val_tokens: int) -> dict[str, Any]:
    cfg = compose_config(["logger=csv", *overrides])
    torch.manual_seed(cfg.seed)
    datamodule, module = build_model(cfg)
    optimizer = module.configure_optimizers()["optimizer"]
    encoder_params = [p for p in module.encoder.parameters()]
    output_params = [p for p in module.output.parameters()]
    started, state, history = time.perf_counter(), None, []
    batches = iter(datamodule.train_dataloader())
    for step in range(1, steps + 1):
        row: dict[str, float] = {"step": step}

        def gradients(window: Window, row: dict[str, float] = row) -> None:  # before clipping
            row.update(loss=window.loss.item(), grad_encoder=grad_norm(encoder_params))
            row.update(grad_output=grad_norm(output_params))

        window = train_step(
            module.encoder,
            module.output,
            next(batches),
            state,
            optimizer,
            cfg.optim.clip,
            cfg.loss_reduction,
            gradients,
        )
        state = window.state
        if step == 1 or step % every == 0:
            row |= hidden_stats(window.hidden.detach())
            history.append(row)
            print(name, {k: round(v, 3) for k, v in row.items()}, flush=True)
    ppl = evaluate(module.encoder, module.output, datamodule.val_dataloader(), val_tokens).ppl
    print(f"{name}: exact val ppl (first {val_tokens} tokens) {ppl:.2f}", flush=True)
    return {
        "name": name,
        "overrides": overrides,
        "val_ppl": ppl,
        "seconds": time.perf_counter() - started,
        "history": history,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs=2, action="append", metavar=("NAME", "OVERRIDES"), required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--val-tokens", type=int, default=30000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="write every run's history and result here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = [probe(name, text.split(), args.steps, args.every, args.val_tokens) for name, text in args.run]
    print("\n| run | val ppl | mean cos at the end | |h| at the end |\n|---|---|---|---|")
    for r in results:
        last = r["history"][-1]
        print(f"| {r['name']} | {r['val_ppl']:.1f} | {last['mean_cos']:.3f} | {last['h_norm']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
