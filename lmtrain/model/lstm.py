"""The LSTM encoder: tokens and carried state -> top-layer hidden states (no vocabulary projection)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from torch import Tensor, nn

from lmtrain.common.part import Part
from lmtrain.common.precision import lstm_region
from lmtrain.common.ranges import AT_LEAST_1, Checked
from lmtrain.model.activation_reg import activation_penalties
from lmtrain.model.dropout import WordDropout, activation_dropout
from lmtrain.model.stack import LayerStack
from lmtrain.model.weight_drop import run_lstm

State = tuple[Tensor, Tensor]  # (h, c), each (num_layers, B, the widest layer's width)
RATE = MappingProxyType({"at_least": 0, "below": 1})  # a dropout probability


@dataclass
class LSTMOptions(Checked):
    """``model=lstm``: the encoder's keys and their defaults (the one place of them; the config schema adds the
    class to build)."""

    emb_dim: int = field(default=200, metadata=AT_LEAST_1)
    hidden_dim: int = field(default=200, metadata=AT_LEAST_1)
    num_layers: int = field(default=2, metadata=AT_LEAST_1)
    # on the embedding output, between layers and on the top output
    dropout: float = field(default=0.0, metadata=RATE)
    init_range: float = field(default=0.1, metadata={"above": 0})  # uniform(-init_range, init_range), every weight
    # the LSTM layers' start: uniform: as every weight (init_range); torch: nn.LSTM's own, uniform(+-1/sqrt(width))
    # per layer, as AWD-LSTM keeps it
    lstm_init: str = field(default="uniform", metadata={"choices": ("uniform", "torch")})
    # sparse row gradients for the input embedding: a step touches only the rows of its tokens (what makes n = 10^6
    # affordable). auto: on when the optimizer updates sparse rows exactly as it would dense ones (sgd or adagrad
    # without momentum or weight decay), off otherwise (adam would switch the embedding to SparseAdam)
    sparse_embedding: bool | str = field(default="auto", metadata={"choices": (True, False, "auto")})
    # AWD-LSTM's regularizers (Merity et al. 2017), all off by default. locked_dropout: the three dropouts below
    # draw one mask per sequence, shared by its time steps (variational dropout), not one per entry
    locked_dropout: bool = False
    # the rates on the embedding output, between layers and on the top output; unset (None): `dropout`
    dropout_input: float | None = field(default=None, metadata=RATE)
    dropout_between: float | None = field(default=None, metadata=RATE)
    dropout_output: float | None = field(default=None, metadata=RATE)
    word_dropout: float = field(default=0.0, metadata=RATE)  # whole words (embedding rows), one mask per forward
    weight_drop: float = field(default=0.0, metadata=RATE)  # DropConnect on weight_hh_l*, one mask per forward
    # added to the training objective only: AR alpha * mean(dropped top output^2), TAR beta * mean((h_t - h_t-1)^2)
    activation_reg: float = field(default=0.0, metadata={"at_least": 0})
    temporal_activation_reg: float = field(default=0.0, metadata={"at_least": 0})
    # the input embedding is the output layer's class vectors (one matrix, owned by the output); the top LSTM layer
    # is then emb_dim wide, the others hidden_dim. Its rows are sparse where the output's are
    tie_weights: bool = False

    def rate(self, specific: float | None) -> float:
        """A dropout site's rate: its own key if set, else ``dropout``."""
        return self.dropout if specific is None else specific


class LSTMEncoder(nn.Module, Part):
    """Embedding, multi-layer LSTM and dropout; the output strategy owns the vocabulary projection.

    Dropout (Zaremba et al. 2014) is applied to the embeddings, between layers and to the top output, each site at
    ``dropout`` unless its own key sets it. AWD-LSTM's regularizers (Merity et al. 2017) are options, off by
    default: locked dropout (``lmtrain.model.dropout``; between layers it runs the layers one by one,
    ``lmtrain.model.stack``), word dropout, weight drop (``lmtrain.model.weight_drop``) and AR / TAR, whose terms
    a training forward leaves in ``penalties`` for the objective (``lmtrain.model.activation_reg``). With them off
    the encoder is the plain embedding, ``nn.LSTM`` and dropout. Every weight is initialised uniformly in
    [-init_range, init_range], the LSTM layers' as ``lstm_init`` says.

    ``sparse_embedding=True`` gives the input embedding sparse row gradients: a step then reads and writes only the
    rows of the window's tokens instead of all n x emb_dim entries (at n = 10^6 the dense gradient's zeroing,
    clipping and update cost more than the rest of the step). ``"auto"`` is resolved by the app from the optimizer
    (``lmtrain.training.optim.sparse_rows_match_dense``); constructed directly it means dense.

    ``tie_weights=True`` (Inan et al. 2017; Press & Wolf 2017) builds no embedding of its own: ``tie`` hands it the
    output layer's lookup of its class vectors, and the top LSTM layer is emb_dim wide (the others hidden_dim), as
    in AWD-LSTM, so that the top output is a class vector's size. Its output is bounded like every LSTM output,
    where a linear map up to emb_dim would be free to grow the logits.
    """

    group, name, Options = "model", "lstm", LSTMOptions  # model=lstm (``lmtrain.common.part``)
    # the run-time values lmtrain.run.build passes besides the config
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes",)

    def __init__(self, num_classes: int, **options: Any) -> None:
        super().__init__()
        self.options = opts = self.Options(**options)  # the keys left out take their defaults
        self.hidden_dim, self.num_layers = opts.hidden_dim, opts.num_layers
        self.num_classes = num_classes
        sparse = opts.sparse_embedding is True
        self.embedding = None if opts.tie_weights else nn.Embedding(num_classes, opts.emb_dim, sparse=sparse)
        self.tied: Callable[[Tensor], Tensor] | None = None  # the output's ``embed``, set by ``tie``
        self.word_drop = WordDropout(opts.word_dropout)
        between = opts.rate(opts.dropout_between) if opts.num_layers > 1 else 0.0
        sizes = [opts.hidden_dim] * (opts.num_layers - 1) + [self.output_dim]  # a tied model's top layer: emb_dim
        if (opts.locked_dropout and between > 0) or len(set(sizes)) > 1:  # what one nn.LSTM cannot do
            drop = activation_dropout(between, opts.locked_dropout)
            self.lstm: nn.Module = LayerStack(opts.emb_dim, sizes, drop, opts.weight_drop)
        else:
            self.lstm = nn.LSTM(opts.emb_dim, sizes[0], opts.num_layers, dropout=between, batch_first=True)
        self.drop_input = activation_dropout(opts.rate(opts.dropout_input), opts.locked_dropout)
        self.drop_output = activation_dropout(opts.rate(opts.dropout_output), opts.locked_dropout)
        for p in self.parameters():
            nn.init.uniform_(p, -opts.init_range, opts.init_range)
        if opts.lstm_init == "torch":
            for layer in (m for m in self.lstm.modules() if isinstance(m, nn.LSTM)):
                layer.reset_parameters()
        # the AR / TAR terms of the last training forward, for the training objective (lmtrain.training.step)
        self.penalties: dict[str, Tensor] = {}

    @property
    def output_dim(self) -> int:
        """The size of the hidden states handed to the output layer (the top layer's width): emb_dim when tied, else
        hidden_dim."""
        return self.options.emb_dim if self.options.tie_weights else self.hidden_dim

    def tie(self, embed: Callable[[Tensor], Tensor]) -> None:
        """``model.tie_weights``: read the input embedding through ``embed`` (the output layer's, tokens (B, T) ->
        their class vectors (B, T, emb_dim)); the matrix stays registered in the output only."""
        if not self.options.tie_weights:
            raise ValueError("this encoder has its own input embedding (model.tie_weights=false)")
        self.tied = embed

    def sparse_parameters(self) -> list[nn.Parameter]:
        """The parameters whose gradients are sparse rows (the optimizer and clipping treat them as such); a tied
        embedding is the output's, which names it."""
        return [self.embedding.weight] if self.embedding is not None and self.embedding.sparse else []

    def forward(self, tokens: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """tokens (B, T) -> hidden (B, T, output_dim), new state."""
        opts = self.options
        embed = self.embedding if self.embedding is not None else self.tied
        if embed is None:
            raise RuntimeError("model.tie_weights=true: tie the encoder to its output layer (tie) before a forward")
        emb = self.drop_input(self.word_drop(embed(tokens), tokens, self.num_classes))  # (B, T, emb_dim)
        with lstm_region(emb.device):
            if isinstance(self.lstm, nn.LSTM):
                raw, state = run_lstm(self.lstm, emb, state, opts.weight_drop)  # (B, T, output_dim)
            else:
                raw, state = self.lstm(emb, state)
        out = self.drop_output(raw)
        ar, tar = opts.activation_reg, opts.temporal_activation_reg
        self.penalties = activation_penalties(raw, out, ar, tar) if self.training else {}
        return out, state  # (B, T, output_dim)
