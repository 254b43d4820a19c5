"""Train a small GPT-2-style causal language model of our own on the CPU, so that the toolkit has a
second LM architecture to compress: GPT-2's Conv1D layers, learned positions, and a tied word
embedding table that dominates the model (16384 × 256 = 4.2M of its 7.4M parameters by default).

The text is the default text's LM train split (`texts.corpus.lm_passages("train")`: about 23,600
passages, 4.3 MB of Python docs and docstrings, none of which the toolkit fine-tunes, calibrates or
evaluates on). A byte-level BPE is trained on it first (`<|endoftext|>` is bos, eos, pad and unk; like
GPT-2 the tokenizer adds no bos/eos around a passage); the passages are then tokenized, joined by
`<|endoftext|>` into one stream, and the model learns from random fixed-length windows of it (AdamW,
linear warmup, cosine decay to a tenth) until the step or time budget is spent. At the end it prints
the held-out perplexity on `lm_passages("eval")`: each passage alone, at most 128 tokens, the mean
negative log-likelihood of every token after the first, exponentiated.

`--out` is written whole or not at all: a Hugging Face model folder (config.json, model.safetensors,
the tokenizer's files) that `AutoModelForCausalLM.from_pretrained(out)` and `AutoTokenizer` load
offline, and `train_lm.json` with the options, steps, seconds, final train loss and eval perplexity.
`--untied` trains separate input and output tables (tie_word_embeddings=False).

`--arch lstm` trains instead a Press & Wolf–style LSTM LM, a plain PyTorch module of our own
(`tools/lstm_lm.py`: embedding → LSTM layers → dropout → output projection; --n-embd is its
width, --n-layer its LSTM layers, 2 unless given), on the same text with the same tokenizer; the
folder then holds model.safetensors, lstm_lm.json and the tokenizer, which `lstm_lm.load` reads.

`make lm` runs (about 13 minutes each on 2 CPU cores):

    python tools/train_lm.py --out runs/lm/gpt2
    python tools/train_lm.py --untied --out runs/lm/gpt2-untied
    python tools/train_lm.py --arch lstm --untied --out runs/lm/lstm
    python tools/train_lm.py --arch lstm --out runs/lm/lstm-tied

and a tiny one for tests, in seconds: `python tools/train_lm.py --tiny --out /tmp/lm`.
The options, their defaults, --tiny's and their checks stand in `tools/train_lm_options.py`.
"""

import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from torch import nn
from tqdm import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from compressor.errors import CompressorError
from files.atomic import atomic_dir
from texts.corpus import lm_passages
from tools import lstm_lm
from tools.train_lm_options import EOT, EVAL_MAX_LENGTH, Options, parse, validate


def train_tokenizer(texts: list[str], vocab: int, n_positions: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab` tokens learned from `texts`, as a Hugging Face tokenizer that pads
    with <|endoftext|> and adds nothing around a passage."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        unk_token=EOT,
        model_max_length=n_positions,
    )


def pack(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All passages' tokens in one stream, each passage followed by <|endoftext|>."""
    eos = tokenizer.eos_token_id
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)  # no length warning
    return torch.tensor([t for e in encodings for t in (*e.ids, eos)], dtype=torch.long)


def build_model(opts: Options, tokenizer: PreTrainedTokenizerFast) -> nn.Module:
    if opts.arch == "lstm":
        cfg = lstm_lm.LSTMConfig(len(tokenizer), opts.n_embd, opts.n_layer, opts.dropout, tied=not opts.untied)
        return lstm_lm.LSTMLM(cfg)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=opts.n_positions,
        n_embd=opts.n_embd,
        n_layer=opts.n_layer,
        n_head=opts.n_head,
        resid_pdrop=opts.dropout,
        embd_pdrop=opts.dropout,
        attn_pdrop=opts.dropout,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=not opts.untied,
    )
    return GPT2LMHeadModel(config)


def word_tables(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(input embedding, output projection) of either architecture."""
    if isinstance(model, lstm_lm.LSTMLM):
        return model.embedding, model.decoder
    return model.get_input_embeddings(), model.get_output_embeddings()


def table_parameters(model: nn.Module) -> int:
    """Parameters in the word tables: one table when tied, two when not."""
    tables = {id(t.weight): t.weight for t in word_tables(model)}
    return sum(t.numel() for t in tables.values())


def forward_logits(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of either architecture."""
    out = model(input_ids=ids, attention_mask=mask)
    return out if isinstance(out, torch.Tensor) else out.logits


def learning_rate(opts: Options, step: int, progress: float) -> float:
    """Linear warmup over the first `warmup` steps, then cosine from `lr` down to lr / 10 as
    `progress` (the spent share of the step or time budget) goes from 0 to 1."""
    warm = min(1.0, (step + 1) / opts.warmup) if opts.warmup else 1.0
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return opts.lr * warm * (0.1 + 0.9 * cosine)


def train(model: nn.Module, stream: torch.Tensor, opts: Options) -> dict:
    """Train in place on random windows of `stream` until the step or time budget is spent."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": opts.weight_decay}, {"params": others, "weight_decay": 0.0}],
        lr=opts.lr,
        betas=(0.9, 0.95),
    )
    windows = torch.Generator().manual_seed(opts.seed)
    budget = opts.minutes * 60
    losses: list[float] = []
    model.train()
    start = time.perf_counter()
    bar = tqdm(total=100, unit="%", bar_format="{l_bar}{bar}| {elapsed}<{remaining}{postfix}", file=sys.stderr)
    step, progress = 0, 0.0
    while progress < 1.0:
        lr = learning_rate(opts, step, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(len(stream) - opts.block, (opts.batch,), generator=windows)
        window = torch.stack([stream[s : s + opts.block + 1] for s in starts.tolist()])  # (B, T+1)
        x, y = window[:, :-1], window[:, 1:]  # (B, T) each
        logits = forward_logits(model, x, torch.ones_like(x))  # (B, T, V); no token is padding here
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        losses.append(loss.item())
        seconds = time.perf_counter() - start
        progress = max(step / opts.steps if opts.steps else 0.0, seconds / budget)
        bar.n = min(100, int(progress * 100))
        bar.set_postfix_str(f"step {step} loss {losses[-1]:.3f} lr {lr:.2e}")
        if step % 100 == 0:
            bar.write(f"step {step}: train loss {sum(losses[-100:]) / 100:.3f} (mean of the last 100), {seconds:.0f} s")
    bar.close()
    last = losses[-20:]
    return {
        "steps": step,
        "seconds": round(time.perf_counter() - start, 1),
        "tokens_seen": step * opts.batch * opts.block,
        "first_loss": round(losses[0], 4),
        "final_train_loss": round(sum(last) / len(last), 4),  # mean of the last 20 steps
    }


@torch.no_grad()
def perplexity(model: nn.Module, tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> tuple[float, int]:
    """(exp of the mean NLL over predicted tokens, their count): each passage alone, at most
    EVAL_MAX_LENGTH tokens, every token after the first predicted."""
    model.eval()
    nll, count = 0.0, 0
    for i in range(0, len(texts), 32):
        batch = tokenizer(
            texts[i : i + 32], padding=True, truncation=True, max_length=EVAL_MAX_LENGTH, return_tensors="pt"
        )
        logits = forward_logits(model, batch["input_ids"], batch["attention_mask"])  # (B, T, V)
        target = batch["input_ids"][:, 1:]  # (B, T-1)
        mask = batch["attention_mask"][:, 1:].bool()  # (B, T-1): right padding is never predicted
        token_nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), target, reduction="none")  # (B, T-1)
        nll += token_nll[mask].sum().item()
        count += int(mask.sum())
    return math.exp(nll / count), count


def save(model: nn.Module, tokenizer: PreTrainedTokenizerFast, record: dict, out: Path) -> None:
    """The model, its tokenizer and train_lm.json in `out`, replaced whole or not at all."""
    with atomic_dir(out) as tmp:
        if isinstance(model, lstm_lm.LSTMLM):
            lstm_lm.save(model, tmp)
        else:
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "train_lm.json").write_text(json.dumps(record, indent=2) + "\n")
        for file in tmp.iterdir():  # safetensors leaves its file 0600; the folder's others follow the umask
            file.chmod(0o666 & ~umask())


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: list[str] | None = None) -> int:
    opts, out, force = parse(argv, __doc__.split("\n\n")[0])
    try:
        validate(opts, out, force)
    except CompressorError as e:
        print(f"train_lm.py: {e}", file=sys.stderr)
        return 2
    began = time.perf_counter()
    torch.manual_seed(opts.seed)
    torch.set_num_threads(os.cpu_count() or 1)

    texts = lm_passages("train")[: opts.max_passages]
    held_out = lm_passages("eval")[: opts.eval_passages]
    tokenizer = train_tokenizer(texts, opts.vocab, opts.n_positions)
    stream = pack(tokenizer, texts)
    print(f"tokenizer: {len(tokenizer)} tokens, learned in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    if len(stream) < opts.block + 1:
        print(
            f"train_lm.py: the {len(texts)} passages make {len(stream)} tokens, fewer than one window", file=sys.stderr
        )
        return 2
    print(f"text: {len(texts)} passages, {len(stream):,} tokens with {EOT} between them", file=sys.stderr)

    model = build_model(opts, tokenizer)
    total, table = sum(p.numel() for p in model.parameters()), table_parameters(model)
    kind = "untied: two tables" if opts.untied else "tied: one table"
    print(f"model: {total:,} parameters, {table:,} of them in the word table(s) ({kind})", file=sys.stderr)

    result = train(model, stream, opts)
    ppl, tokens = perplexity(model, tokenizer, held_out) if held_out else (None, 0)
    record = {
        "options": asdict(opts),
        "vocab_size": len(tokenizer),
        "parameters": total,
        "table_parameters": table,
        "tied": not opts.untied,
        "train_passages": len(texts),
        "train_tokens": len(stream),
        **result,
        "eval_passages": len(held_out),
        "eval_tokens": tokens,
        "eval_perplexity": round(ppl, 3) if ppl is not None else None,
        "total_seconds": round(time.perf_counter() - began, 1),
    }
    save(model, tokenizer, record, out)
    print(
        f"{result['steps']} steps in {result['seconds']:.0f} s, final train loss {result['final_train_loss']:.3f}, "
        f"eval perplexity {record['eval_perplexity']} over {tokens:,} tokens of {len(held_out)} passages; wrote {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
