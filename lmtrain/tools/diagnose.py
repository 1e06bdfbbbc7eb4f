"""Bias diagnostics for a trained checkpoint: KL(p || q) and the relative sampled-softmax gradient bias per proposal.

    python -m lmtrain.diagnose ckpt_path=RUN/checkpoints/best-12.ckpt sampler=uniform,rff output.num_samples=10,100

For ``positions`` held-out positions (validation split, after carrying the LSTM state through ``windows``
windows), each proposal q named in ``sampler=`` (conf/sampler/*.yaml; ``sampler.KEY=VALUE`` sets an option of
the samplers that have it) is attached to the checkpoint's output layer and, for each m in
``output.num_samples=``, ``draws`` sampled gradients per position give the relative bias (lmtrain.tools.estimator_bias).
A full-softmax checkpoint is diagnosed as the sampled softmax of the same logits. Writes diagnose.json,
diagnose.md and bias_vs_samples.png to ``out`` (default RUN/diagnose) and prints the table.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lmtrain.cli.failures import fail
from lmtrain.config import choices, compose_config
from lmtrain.output import FullSoftmax, SampledSoftmax
from lmtrain.run.build import Runtime, build
from lmtrain.sampler import UniformSampler
from lmtrain.tools.estimator_bias import all_logits, gradient_bias, hidden_spread, proposal_kl
from lmtrain.tools.trained import load_model, parse_options, resolve_checkpoint
from lmtrain.training.step import carry

DEFAULTS: dict[str, str] = {
    "ckpt_path": "",
    "sampler": "softmax,uniform,unigram,quadratic,rff",
    "output.num_samples": "10,30,100,300",
    "positions": "100",
    "draws": "200",
    "groups": "10",
    "windows": "10",
    "seed": "0",
    "out": "",
}


def parse_args(argv: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """key=value arguments -> (options, sampler.* overrides, data.* overrides); unknown keys are errors."""
    options, overrides = parse_options(argv, DEFAULTS, ("sampler.", "data."))
    unknown = [s for s in options["sampler"].split(",") if s not in choices("sampler")]
    if unknown:
        raise ValueError(f"unknown sampler {unknown[0]!r}; choose from {', '.join(choices('sampler'))}")
    return options, overrides["sampler."], overrides["data."]


@torch.no_grad()
def held_out_positions(datamodule: Any, module: Any, windows: int, positions: int) -> tuple[torch.Tensor, ...]:
    """Hidden states (P, d), targets (P,) and input tokens (P,) at ``positions`` random positions of validation
    windows 2..windows (the state is carried from window 1, so no position starts from a zero state)."""
    hidden, targets, tokens, state = [], [], [], None
    for index, (inputs, target) in enumerate(datamodule.val_dataloader()):
        if index >= windows:
            break
        out, state = carry(module.encoder, inputs, state)  # (B*T, d), as the run's evaluation reads it
        if index > 0:
            hidden.append(out)
            targets.append(target.reshape(-1))
            tokens.append(inputs.reshape(-1))
    if not hidden:
        raise ValueError(f"windows={windows}: need at least 2 validation windows (the first only warms the state)")
    h, t, x = torch.cat(hidden), torch.cat(targets), torch.cat(tokens)
    pick = torch.randperm(h.shape[0])[:positions]
    return h[pick], t[pick], x[pick]


def as_sampled_softmax(output: Any) -> SampledSoftmax:
    """The checkpoint's softmax model as a SampledSoftmax over the same logits (a FullSoftmax's [W, b])."""
    if isinstance(output, SampledSoftmax):
        return output
    if isinstance(output, FullSoftmax):
        sampled = SampledSoftmax(output.num_classes, output.dim, sampler=UniformSampler(output.num_classes))
        sampled.weight.data = torch.cat([output.weight.detach(), output.bias.detach().unsqueeze(1)], dim=1)
        return sampled
    raise ValueError(
        f"diagnose needs a softmax output (full or a sampled softmax: exp, uniform, unigram, quadratic, rff, ...); "
        f"this checkpoint's output is {type(output).__name__}"
    )


def build_sampler(name: str, overrides: list[str], runtime: Runtime) -> Any:
    keys = set(compose_config(["output=sampled", f"sampler={name}"]).sampler)
    own = [o for o in overrides if o.split("=", 1)[0].removeprefix("sampler.") in keys]
    return build(compose_config(["output=sampled", f"sampler={name}", *own]).sampler, runtime)


def diagnose(argv: list[str]) -> dict[str, Any]:
    options, sampler_overrides, data_overrides = parse_args(argv)
    ckpt = resolve_checkpoint(Path(options["ckpt_path"]))
    datamodule, module = load_model(ckpt, data_overrides)
    torch.manual_seed(int(options["seed"]))
    output = as_sampled_softmax(module.output)
    hidden, target, inputs = held_out_positions(datamodule, module, int(options["windows"]), int(options["positions"]))
    log_p = torch.log_softmax(all_logits(output, hidden).detach(), dim=1).double()  # (P, n)
    runtime = Runtime(output.num_classes, output.dim, datamodule.counts, datamodule.train_ids)
    samplers = options["sampler"].split(",")
    sizes = [int(m) for m in options["output.num_samples"].split(",")]
    rows = []
    for name in samplers:
        output.attach(build_sampler(name, sampler_overrides, runtime))
        proposal = output.propose(output.query(hidden), inputs)
        kl = proposal_kl(log_p, proposal.log_q_all(output.num_classes).double())  # (P,)
        for m in sizes:
            output.num_samples = m
            started = time.perf_counter()
            estimate = gradient_bias(output, hidden, target, int(options["draws"]), int(options["groups"]), inputs)
            rows.append(
                {
                    "sampler": name,
                    "num_samples": m,
                    "kl": float(kl.mean()),
                    "kl_se": float(kl.std() / kl.numel() ** 0.5),
                    **asdict(estimate),
                    "seconds": time.perf_counter() - started,
                }
            )
            print(format_row(rows[-1]), flush=True)
    out = Path(options["out"]) if options["out"] else ckpt.parent.parent / "diagnose"
    report = {
        "checkpoint": str(ckpt),
        "positions": int(hidden.shape[0]),
        "hidden": hidden_spread(hidden),
        "options": options,
        "rows": rows,
    }
    write_report(report, out)
    return report


def format_row(row: dict[str, Any]) -> str:
    return (
        f"| {row['sampler']} | {row['num_samples']} | {row['kl']:.3f} ± {row['kl_se']:.3f} | "
        f"{row['bias']:.4f} ± {row['standard_error']:.4f} | "
        f"{row['pooled_bias']:.4f} ± {row['pooled_standard_error']:.4f} | "
        f"{row['noise']:.4f} | {row['seconds']:.1f} |"
    )


def plot_bias_vs_samples(rows: list[dict[str, Any]], path: Path) -> Path:
    """Relative gradient bias against m per sampler, log-log (left): RMS over positions with ±2 s.e. bars (solid)
    and pooled (dashed); KL(p || q) per sampler (right)."""
    from lmtrain.tools.figures import pyplot, save_figure

    plt = pyplot()
    fig, (ax, ax_kl) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    samplers = list(dict.fromkeys(r["sampler"] for r in rows))
    for name in samplers:
        mine = [r for r in rows if r["sampler"] == name]
        floor = [max(r["bias"], 1e-4) for r in mine]  # a zero bias (the model's own softmax) on a log axis
        ax.errorbar(
            [r["num_samples"] for r in mine], floor, yerr=[2 * r["standard_error"] for r in mine], marker="o", capsize=3
        )
        ax.lines[-1].set_label(f"{name} (RMS)")
        pooled = [max(r["pooled_bias"], 1e-4) for r in mine]
        ax.plot([r["num_samples"] for r in mine], pooled, ls="--", color=ax.lines[-1].get_color(), label="pooled")
        ax.lines[-1].set_label(f"{name} (pooled)")
    sizes = sorted({r["num_samples"] for r in rows})
    ax.set(xscale="log", yscale="log", xlabel="number of samples m", ylabel="|| E[g'] - g || / || g ||")
    ax.set_xticks(sizes, [str(m) for m in sizes])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_title("relative bias of the sampled-softmax gradient")
    if any(r["bias"] < 1e-4 for r in rows):
        ax.annotate("estimates below 1e-4 (0) drawn at 1e-4", (0.02, 0.02), xycoords="axes fraction", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    kl = {r["sampler"]: r["kl"] for r in rows}
    ax_kl.barh(samplers, [kl[name] for name in samplers], color="gray")
    ax_kl.set(xlabel="KL(p || q), nats", title="proposal vs model softmax")
    ax_kl.invert_yaxis()
    return save_figure(fig, path, plt)


def write_report(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "diagnose.json").write_text(json.dumps(report, indent=2))
    spread = report["hidden"]
    header = (
        f"Checkpoint {report['checkpoint']}, {report['positions']} held-out positions, "
        f"{report['options']['draws']} draws per position and m. Hidden states: mean pairwise cosine "
        f"{spread['mean_pairwise_cosine']:.4f}, per-unit std across positions {spread['unit_std']:.3g} "
        "(1 and 0 for an LSTM that gives every position the same state).\n\n"
        "| sampler | m | KL(p‖q) nats ± s.e. | relative gradient bias (RMS) ± s.e. | pooled ± s.e. "
        "| MC noise | seconds |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    (out / "diagnose.md").write_text(header + "\n".join(format_row(r) for r in report["rows"]) + "\n")
    plot_bias_vs_samples(report["rows"], out / "bias_vs_samples.png")
    print(f"wrote {out / 'diagnose.md'}, {out / 'diagnose.json'}, {out / 'bias_vs_samples.png'}")


def main(argv: list[str] | None = None) -> int:
    try:
        diagnose(sys.argv[1:] if argv is None else argv)
    except (ValueError, FileNotFoundError) as exc:  # CheckpointError, DataError and bad arguments are ValueErrors
        fail(str(exc).strip().splitlines()[0])
    return 0
