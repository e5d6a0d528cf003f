"""Train the bundled tiny Llama on the standard-library corpus.

Reproduce:  python scripts/train_tiny_model.py --out quantlab/bundled/tiny-stdlib-llama

Writes the tokenizer, config, safetensors weights, the held-out text and a
training log (train.json) that the model card quotes. The split is by source
(module or pydoc topic), so held-out text is never trained on.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quantlab.corpus import documents, text_of  # noqa: E402

EOS = "<|endoftext|>"


def train_tokenizer(train_text: list[str], vocab_size: int, out: Path) -> PreTrainedTokenizerFast:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(train_text, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS, unk_token=EOS, pad_token=EOS)
    tok.model_max_length = 1 << 20
    tok.save_pretrained(out)
    return tok


def encode(tok: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for text in texts:
        ids.extend(tok(text, add_special_tokens=False)["input_ids"])
        ids.append(tok.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def heldout_perplexity(model: LlamaForCausalLM, ids: torch.Tensor, window: int) -> float:
    model.eval()
    n = (ids.numel() // window) * window
    windows = ids[:n].view(-1, window)
    nll, count = 0.0, 0
    for batch in windows.split(16):
        logits = model(batch).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum")
        nll += loss.item()
        count += batch[:, 1:].numel()
    model.train()
    return math.exp(nll / count)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("quantlab/bundled/tiny-stdlib-llama"))
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=640)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--minutes", type=float, default=12.0, help="wall-clock training budget")
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    train_docs, heldout_docs = documents("train"), documents("heldout")
    tok = train_tokenizer([d.text for d in train_docs], args.vocab_size, args.out)
    train_ids = encode(tok, [d.text for d in train_docs])
    heldout_ids = encode(tok, [d.text for d in heldout_docs])
    (args.out / "heldout.txt").write_text(text_of(heldout_docs), encoding="utf-8")
    print(f"train tokens {train_ids.numel():,}  held-out tokens {heldout_ids.numel():,}", flush=True)

    config = LlamaConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters {params:,}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    budget_s = args.minutes * 60
    warmup = 100
    gen = torch.Generator().manual_seed(args.seed)
    best = (float("inf"), None, 0)
    log = []
    start = time.time()
    step = 0
    while step < args.max_steps:
        elapsed = time.time() - start
        if elapsed > budget_s:
            break
        progress = min(1.0, max(step / args.max_steps, elapsed / budget_s))
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train_ids.numel() - args.seq_len - 1, (args.batch,), generator=gen)
        batch = torch.stack([train_ids[s: s + args.seq_len] for s in starts])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % args.eval_every == 0:
            ppl = heldout_perplexity(model, heldout_ids[: 64 * args.seq_len], args.seq_len)
            log.append({"step": step, "train_loss": round(loss.item(), 4), "heldout_ppl": round(ppl, 3),
                        "elapsed_s": round(time.time() - start, 1), "lr": lr})
            print(json.dumps(log[-1]), flush=True)
            if ppl < best[0]:
                best = (ppl, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)

    model.load_state_dict(best[1])
    model.save_pretrained(args.out, safe_serialization=True)
    full_ppl = heldout_perplexity(model, heldout_ids, args.seq_len)
    info = {"parameters": params, "train_tokens": int(train_ids.numel()), "heldout_tokens": int(heldout_ids.numel()),
            "best_step": best[2], "steps_run": step, "heldout_ppl_window_256": round(full_ppl, 3),
            "python": sys.version.split()[0], "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
            "log": log}
    (args.out / "train.json").write_text(json.dumps(info, indent=1))
    print(f"best step {best[2]}  held-out perplexity (all, window {args.seq_len}) {full_ppl:.3f}")


if __name__ == "__main__":
    main()
