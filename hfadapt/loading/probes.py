"""The fixed probe inputs every model is judged on: sentences of mixed lengths, languages and
scripts, tokenized as one batch padded to a multiple of 64 (the device's static shapes); and,
for structural runs without a tokenizer, deterministic random ids with a realistic padding mask."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from hfadapt.loading.load import LoadedModel

# The device only takes sequence lengths that are whole sticks (docs/device-profile.md, the layout section).
PAD_MULTIPLE = 64
# Longest padded length probed: long enough for the paragraph, short enough to stay fast.
MAX_PROBE_LENGTH = 512

LONG_PARAGRAPH = (
    "The accelerator sits in a PCIe slot and draws about seventy-five watts. Each of its "
    "thirty-two cores has a small scratchpad, and data moves between memory and the cores in "
    "fixed-size sticks of one hundred and twenty-eight bytes, so every tensor's innermost "
    "dimension is padded to a whole number of sticks. Matrix multiplications want their inner "
    "dimension aligned to sixty-four half-precision elements; sequence lengths are padded the "
    "same way, because shapes are static once a graph has been compiled. Numbers are stored in "
    "a sixteen-bit format with six exponent bits and nine mantissa bits, which trades precision "
    "for range: results that fit easily in single precision can lose their last digits, and an "
    "attention mask filled with the most negative half-precision value saturates instead of "
    "becoming minus infinity. An embedding model is judged by comparing the hidden state of "
    "every real token against a reference computed in single precision on the host, and it "
    "passes only when the worst token still points in almost exactly the same direction."
)

# Fixed forever in spirit: changing a sentence changes every recorded cosine.
PROBE_SENTENCES: tuple[str, ...] = (
    "Hello, world!",
    "A quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Die Katze schläft auf dem warmen Fensterbrett, während draußen der Regen fällt.",
    "Le système de recherche sémantique compare des phrases plutôt que des mots-clés.",
    "机器学习模型可以将句子转换为向量，以便比较它们的含义。",
    "東京の天気は明日から崩れるそうなので、傘を忘れないでください。",
    "تعمل نماذج التضمين على تحويل النصوص إلى متجهات رقمية.",
    "Модели эмбеддингов переводят предложения в векторы для поиска по смыслу.",
    "एम्बेडिंग मॉडल वाक्यों को संख्याओं की सूची में बदलते हैं।",
    "def cosine(a, b):\n    return (a @ b) / (a.norm() * b.norm())",
    "Order #48213 shipped 2026-07-14: 3 x 12.50 EUR, total 37.50 EUR (VAT 19%).",
    LONG_PARAGRAPH,
)

# Token counts of four probe sentences under a typical WordPiece tokenizer (the shortest, two
# mid-length ones, one just under a stick, and the paragraph): random probes use them so a
# structural run sees the padding pattern of a real one (short rows padded far, one long row),
# padded to the same 256 tokens. Four rows, not all twelve: with random weights the rows only
# differ in their lengths, and a structural unit then costs about half (a BERT-base unit 13.1 s
# -> 7.0 s), which keeps a sweep of the bundled 10,000 near five minutes.
RANDOM_LENGTHS: tuple[int, ...] = (6, 31, 62, 212)


@dataclass
class ProbeBatch:
    """One padded batch of probe inputs (CPU tensors) and where its ids came from."""

    inputs: dict[str, torch.Tensor]
    source: str  # "tokenizer" | "random"
    texts: tuple[str, ...] | None = None
    folded_vocab: int | None = None  # ids folded into a shrunk vocabulary (structural mode)

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.inputs["attention_mask"]

    @property
    def shape(self) -> tuple[int, int]:
        b, s = self.inputs["input_ids"].shape
        return int(b), int(s)

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def select(self, rows: list[int]) -> ProbeBatch:
        """A batch of some rows only (localization replays the worst sentences)."""
        index = torch.tensor(rows, dtype=torch.long)
        texts = tuple(self.texts[i] for i in rows) if self.texts else None
        return ProbeBatch(
            {k: v.index_select(0, index) for k, v in self.inputs.items()},
            self.source,
            texts,
            self.folded_vocab,
        )

    def describe(self) -> str:
        b, s = self.shape
        return f"{b} probes x {s} tokens ({self.real_tokens} real, ids from {self.source})"


def max_probe_length(config: PretrainedConfig, tokenizer: object = None) -> int:
    """The longest padded length the model accepts, rounded down to a multiple of 64."""
    limit = MAX_PROBE_LENGTH
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        # RoBERTa-style tables reserve padding_idx + 1 rows (514 = 512 + 2).
        limit = min(limit, positions - 2 if positions % PAD_MULTIPLE == 2 else positions)
    model_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(model_max, int) and 0 < model_max < 1_000_000:
        limit = min(limit, model_max)
    return max(PAD_MULTIPLE, limit // PAD_MULTIPLE * PAD_MULTIPLE)


def tokenize_probes(
    tokenizer: Any, config: Any = None, *, max_length: int | None = None
) -> ProbeBatch:
    """The probe sentences as one batch, padded to a multiple of 64 (``pad_to_multiple_of=64``)."""
    if getattr(tokenizer, "pad_token", None) is None:
        # Decoder tokenizers often have no pad token; any id works because pads are masked.
        fallback = getattr(tokenizer, "eos_token", None) or getattr(tokenizer, "unk_token", None)
        if fallback is not None:
            tokenizer.pad_token = fallback
    length = max_length or max_probe_length(config, tokenizer)
    encoded = tokenizer(
        list(PROBE_SENTENCES),
        padding=True,
        truncation=True,
        max_length=length,
        pad_to_multiple_of=PAD_MULTIPLE,
        return_tensors="pt",
    )
    inputs = {k: v for k, v in encoded.items() if isinstance(v, torch.Tensor)}
    if "attention_mask" not in inputs:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    return ProbeBatch(inputs, "tokenizer", PROBE_SENTENCES)


SPECIAL_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")


def _special_ids(config: PretrainedConfig) -> list[int]:
    ids: list[int] = []
    for name in SPECIAL_ID_FIELDS:
        value = getattr(config, name, None)
        values = value if isinstance(value, list) else [value]
        ids.extend(v for v in values if isinstance(v, int) and v >= 0)
    return ids


def reserved_ids(config: PretrainedConfig) -> int:
    """Ids below this are special tokens; random and folded ids stay at or above it."""
    specials = _special_ids(config)
    return max(specials) + 1 if specials else 0


NO_RANDOM_PROBES = "config has no usable vocab_size for random probe ids"


def random_probe_vocab(config: PretrainedConfig) -> int:
    """How many ids random probes draw from: the config's own vocab_size (0: none usable, as in
    a composite vision + text config, whose vocabulary sits in its text_config)."""
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    return vocab if vocab > 1 else 0


def random_probes(
    config: PretrainedConfig, *, seed: int = 0, max_length: int | None = None
) -> ProbeBatch:
    """Deterministic random ids with the probe sentences' padding pattern, right-padded."""
    vocab = random_probe_vocab(config)
    if not vocab:
        raise ValueError(NO_RANDOM_PROBES)
    length_cap = max_length or max_probe_length(config)
    lengths = [max(2, min(n, length_cap)) for n in RANDOM_LENGTHS]
    seq = min(length_cap, -(-max(lengths) // PAD_MULTIPLE) * PAD_MULTIPLE)
    low = min(reserved_ids(config), vocab - 1)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, vocab, (len(lengths), seq), generator=gen)
    pad = getattr(config, "pad_token_id", None)
    pad_id = pad if isinstance(pad, int) and 0 <= pad < vocab else 0
    start = next(
        (
            getattr(config, n)
            for n in ("cls_token_id", "bos_token_id")
            if isinstance(getattr(config, n, None), int)
        ),
        None,
    )
    end = next(
        (
            getattr(config, n)
            for n in ("sep_token_id", "eos_token_id")
            if isinstance(getattr(config, n, None), int)
        ),
        None,
    )
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        ids[row, n:] = pad_id
        if start is not None and start < vocab:
            ids[row, 0] = start
        if end is not None and end < vocab:
            ids[row, n - 1] = end
    inputs = {"input_ids": ids, "attention_mask": mask}
    if int(getattr(config, "type_vocab_size", 0) or 0) > 0:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return ProbeBatch(inputs, "random")


def fold_ids(batch: ProbeBatch, vocab_size: int, reserved: int) -> ProbeBatch:
    """Map ids past a shrunk vocabulary back into ``[reserved, vocab_size)``; special ids (below
    ``reserved``) stay, so padding and position ids behave as with the full vocabulary."""
    ids = batch.inputs["input_ids"]
    span = max(1, vocab_size - reserved)
    folded = torch.where(ids < vocab_size, ids, reserved + (ids - reserved) % span)
    inputs = dict(batch.inputs, input_ids=folded)
    return ProbeBatch(inputs, batch.source, batch.texts, vocab_size)


def model_inputs(model: torch.nn.Module, batch: ProbeBatch) -> dict[str, torch.Tensor]:
    """The batch's tensors the model's forward accepts (DistilBERT takes no token_type_ids)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return dict(batch.inputs)
    if (
        any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        and "input_ids" not in params
    ):
        return dict(batch.inputs)
    return {k: v for k, v in batch.inputs.items() if k in params}


def build_probes(loaded: LoadedModel) -> ProbeBatch:
    """The probe batch for this model: tokenized sentences, or random ids without a tokenizer."""
    config = loaded.config
    if loaded.tokenizer is None:
        return random_probes(config)
    batch = tokenize_probes(loaded.tokenizer, config)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab and int(batch.inputs["input_ids"].max()) >= vocab:
        # A structural model's shrunk vocabulary: fold the real ids into it.
        batch = fold_ids(batch, vocab, min(reserved_ids(config), vocab - 1))
    return batch
