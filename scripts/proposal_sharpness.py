"""How close can an exp(nu cos) kernel proposal get to a trained cosine model's softmax, exactly and through RFF?

    LMTRAIN_DATA_DIR=../shared/data python scripts/proposal_sharpness.py RUN_DIR --nu 2,4,6,8,10 --json out.json

For held-out positions of a trained ``output=rff`` checkpoint (the cosine model, logits tau * cos), prints
KL(p || q) in nats, averaged over positions, for three proposals at each kernel sharpness nu:
- ``exact``: q ∝ exp(nu cos(h, w)), the kernel the RFF proposal estimates, computed exactly;
- ``rff``: the RFF proposal as trained (``sampler=rff``, D frequencies, the kernel tree), its exact log q;
- ``rff + unigram``: the same mixed with the training unigram (``sampler.unigram_share``).
The model's own scale, tau times the soft-normalized |h|, is printed too: the exact kernel matches p at that nu.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from lmtrain.sampler import RFFSampler
from lmtrain.tools.diagnose import held_out_positions
from lmtrain.tools.estimator_bias import all_logits
from lmtrain.tools.trained import load_model, resolve_checkpoint


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> float:
    """Mean over rows of KL(p || q) from log-probabilities (P, n)."""
    return (log_p.exp() * (log_p - log_q)).sum(1).mean().item()


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="run folder or checkpoint of an output=rff model")
    parser.add_argument("--nu", default="2,4,6,8,10", help="kernel sharpness values")
    parser.add_argument("--D", type=int, default=1024, help="random frequencies of the RFF proposal")
    parser.add_argument("--unigram-share", type=float, default=0.25)
    parser.add_argument("--positions", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    datamodule, module = load_model(resolve_checkpoint(args.run), [])
    output = module.output
    hidden, _, _ = held_out_positions(datamodule, module, 10, args.positions)
    log_p = torch.log_softmax(all_logits(output, hidden), 1).double()  # (P, n)
    query = output.query(hidden)  # (P, d)
    cos = F.normalize(query, dim=-1) @ F.normalize(output.weight, dim=-1).T  # (P, n)
    norm = hidden.norm(dim=-1)
    scale = (output.tau * norm / (norm.square() + output.norm_eps**2).sqrt()).mean().item()
    print(f"model scale tau * |h| / sqrt(|h|^2 + eps^2), mean over positions: {scale:.2f}")
    rows = []
    print("| nu | KL exact exp(nu cos) | KL rff | KL rff + unigram |\n|---|---|---|---|")
    for nu in (float(v) for v in args.nu.split(",")):
        row = {"nu": nu, "exact": kl(log_p, torch.log_softmax(nu * cos, 1).double())}
        for name, share in (("rff", 0.0), ("rff_unigram", args.unigram_share)):
            sampler = RFFSampler(D=args.D, nu=nu, seed=0, unigram_share=share, counts=datamodule.counts)
            sampler.update(output.weight)
            row[name] = kl(log_p, sampler.propose(query).log_q_all(output.num_classes).double())
        rows.append(row)
        print(f"| {nu:g} | {row['exact']:.3f} | {row['rff']:.3f} | {row['rff_unigram']:.3f} |")
    if args.json:
        result = {"run": str(args.run), "model_scale": scale, "D": args.D, "unigram_share": args.unigram_share}
        args.json.write_text(json.dumps({**result, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
