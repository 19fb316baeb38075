#!/usr/bin/env python3
"""Golden logits for the CPU reference from Hugging Face transformers' GptOssForCausalLM.

Runs transformers (an implementation nobody on this project wrote) in float32, with the MXFP4 experts
dequantised, on a synthetic checkpoint written by `osprey make-model`, and saves small golden files
that tests/model/test_parity.cpp compares the CPU reference against:

  manifest.json        what was run (seed, preset, prompts, exact command, versions, machine) and, per
                       case, the positions whose logits were kept, the 32-step greedy continuation and
                       conditioning margins of the synthetic model
  <case>.ids.i32       [n_rows, K] int32 little-endian: the vocabulary ids kept for each row
  <case>.logits.f32    [n_rows, K] float32 little-endian: their logits

Each kept row holds K = 512 ids: the 32 largest logits of that row (in descending order) followed by
480 ids drawn once from a fixed generator (the same for every row, sorted). The tests compare with
  rel_err(row) = max_i |ours_i - hf_i| / max_i |hf_i|      over the row's K ids.

Cases: "short" (12 prompt tokens, logits at every position) and "long" (320 prompt tokens, so that
positions pass the 128-token sliding window; logits at 14 positions around the window edges).
For "short", <case>.steps.f32 also holds intermediates for a layer-by-layer comparison, named as the
CPU reference's dump steps: per layer, resid_attn [T, H], router_logits [T, E], resid_mlp [T, H]
(float32, concatenated in the order and at the offsets (in floats) listed in the manifest).

usage: hf_parity.py --model DIR --out DIR [--device cpu|cuda] [--seed N] [--preset tiny] [--command TEXT]
"""
import argparse
import json
import os
import platform
import sys

import numpy as np
import torch

K_TOP = 32
K_FIXED = 480
GREEDY_STEPS = 32
CASES = {
    # name: (prompt length, generator seed of the prompt ids, positions whose logits are kept)
    "short": (12, 1001, list(range(12))),
    "long": (320, 1002, [0, 1, 2, 63, 126, 127, 128, 129, 191, 255, 256, 257, 300, 319]),
}
PROMPT_ID_LIMIT = 199998  # ordinary o200k tokens only (no specials)


def prompt_ids(length, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, PROMPT_ID_LIMIT, size=length)]


def fixed_ids(vocab):
    return np.sort(np.random.default_rng(7).choice(vocab, size=K_FIXED, replace=False)).astype(np.int64)


def checkpoint_checksum(model_dir):
    """Order-dependent checksum of every *.safetensors file (sorted by name): the sum over the files'
    bytes, read as little-endian uint64 words w_i (zero-padded), of w_i * (2i + 1) mod 2^64, plus the
    total size. The parity test recomputes it to tell a changed synthetic writer from a wrong forward."""
    total, size, offset = np.uint64(0), 0, 0
    for name in sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors")):
        data = open(os.path.join(model_dir, name), "rb").read()
        size += len(data)
        data += b"\0" * (-len(data) % 8)
        words = np.frombuffer(data, dtype="<u8")
        weights = np.arange(offset, offset + len(words), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        with np.errstate(over="ignore"):
            total = total + np.sum(words * weights, dtype=np.uint64)
        offset += len(words)
    return {"sum": f"{int(total):016x}", "bytes": size}


def load_model(model_dir, device):
    from transformers import GptOssForCausalLM, Mxfp4Config

    model = GptOssForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.float32,
        quantization_config=Mxfp4Config(dequantize=True),
        attn_implementation="eager",
        experts_implementation="eager",
    )
    model = model.to(device=device, dtype=torch.float32).eval()
    return model


def check_model(model, model_dir):
    """Fails loudly when transformers read the checkpoint differently from the spec."""
    cfg = model.config
    rope = cfg.rope_parameters
    assert rope["rope_type"] == "yarn" and rope.get("truncate", True) is False, f"rope parameters {rope}"
    for p in model.parameters():
        assert p.dtype == torch.float32, f"parameter of dtype {p.dtype}"
    # Expert 0 of layer 0, dequantised independently from the safetensors bytes (spec §6.4), must equal
    # transformers' dequantised (transposed, [in, out]) tensor exactly.
    from safetensors import safe_open

    index = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))
    name = "model.layers.0.mlp.experts.gate_up_proj_blocks"
    with safe_open(os.path.join(model_dir, index["weight_map"][name]), "np") as f:
        blocks = f.get_tensor(name)[0]  # [2I, H/32, 16]
        scales = f.get_tensor("model.layers.0.mlp.experts.gate_up_proj_scales")[0].astype(np.int32)  # [2I, H/32]
    fp4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
    lo, hi = fp4[blocks & 0x0F], fp4[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(blocks.shape[0], blocks.shape[1], 32)
    w = np.ldexp(vals, (scales - 127)[..., None]).reshape(blocks.shape[0], -1)  # [2I, H]
    hf = model.model.layers[0].mlp.experts.gate_up_proj[0].detach().cpu().numpy()  # [H, 2I]
    assert np.array_equal(hf.T, w), "transformers' dequantised experts differ from the spec's MXFP4 decoding"


# Intermediates recorded for the "short" case, named as the CPU reference's dump steps
# (model/gpt_oss_ref.h): the residual stream after each half-block and the router logits, every token.
STEP_NAMES = ["resid_attn", "router_logits", "resid_mlp"]


def record_steps(model, store):
    """Forward hooks that put each layer's intermediates into store[(step, layer)] ([T, width])."""
    handles = []
    for i, layer in enumerate(model.model.layers):
        def pre_norm(mod, args, i=i):  # the post-attention norm's input is x after the attention residual
            store[("resid_attn", i)] = args[0][0].detach().float().cpu()
        def router(mod, args, out, i=i):
            store[("router_logits", i)] = out[0].detach().float().cpu()
        def block(mod, args, out, i=i):
            out = out[0] if isinstance(out, tuple) else out
            store[("resid_mlp", i)] = out[0].detach().float().cpu()
        handles.append(layer.post_attention_layernorm.register_forward_pre_hook(pre_norm))
        handles.append(layer.mlp.router.register_forward_hook(router))
        handles.append(layer.register_forward_hook(block))
    return handles


@torch.no_grad()
def run_case(model, device, name, length, seed, positions, vocab, out_dir, with_steps=False):
    ids = prompt_ids(length, seed)
    x = torch.tensor([ids], device=device)
    store = {}
    handles = record_steps(model, store) if with_steps else []
    out = model(input_ids=x, use_cache=False, output_router_logits=True)
    for h in handles:
        h.remove()
    steps = []
    if with_steps:
        blobs, offset = [], 0
        for layer in range(model.config.num_hidden_layers):
            for step in STEP_NAMES:
                t = store[(step, layer)].numpy().astype("<f4")
                assert t.shape[0] == length, f"{step} {layer}: shape {t.shape}"
                steps.append({"name": step, "layer": layer, "width": int(t.shape[1]), "offset": offset})
                blobs.append(t.reshape(-1))
                offset += t.size
        np.concatenate(blobs).tofile(os.path.join(out_dir, f"{name}.steps.f32"))
    logits = out.logits[0].float().cpu()  # [T, vocab]
    fixed = fixed_ids(vocab)
    rows_ids, rows_val, margins = [], [], []
    for p in positions:
        row = logits[p]
        top = torch.topk(row, K_TOP).indices.numpy()
        keep = np.concatenate([top, fixed]).astype(np.int32)
        rows_ids.append(keep)
        rows_val.append(row.numpy()[keep].astype(np.float32))
        margins.append(float(row[top[0]] - row[top[1]]))
    np.stack(rows_ids).astype("<i4").tofile(os.path.join(out_dir, f"{name}.ids.i32"))
    np.stack(rows_val).astype("<f4").tofile(os.path.join(out_dir, f"{name}.logits.f32"))

    # Router conditioning: gap between the 4th and 5th router logit, smallest over tokens, per layer.
    router_gaps = []
    for r in out.router_logits:
        s = torch.sort(r.float(), dim=-1, descending=True).values
        router_gaps.append(float((s[:, 3] - s[:, 4]).min()))

    # Greedy continuation, recomputing the whole sequence each step (no KV cache involved).
    seq = list(ids)
    greedy, greedy_margins = [], []
    for _ in range(GREEDY_STEPS):
        step = model(input_ids=torch.tensor([seq], device=device), use_cache=False, logits_to_keep=1)
        row = step.logits[0, -1].float().cpu()
        top2 = torch.topk(row, 2)
        tok = int(torch.argmax(row))  # first (lowest) id among equal maxima
        greedy.append(tok)
        greedy_margins.append(float(top2.values[0] - top2.values[1]))
        seq.append(tok)
    return {
        "name": name,
        "prompt_ids": ids,
        "prompt_seed": seed,
        "positions": positions,
        "ids_per_row": K_TOP + K_FIXED,
        "ids_file": f"{name}.ids.i32",
        "logits_file": f"{name}.logits.f32",
        "top1_top2_margin_at_positions": margins,
        "greedy_tokens": greedy,
        "greedy_top1_top2_margins": greedy_margins,
        "router_4th_5th_min_gap_per_layer": router_gaps,
        "steps_file": f"{name}.steps.f32" if with_steps else None,
        "steps": steps,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="synthetic checkpoint folder (HF layout)")
    ap.add_argument("--out", required=True, help="folder for manifest.json and the golden files")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0, help="seed the checkpoint was made with (recorded)")
    ap.add_argument("--preset", default="tiny", help="preset the checkpoint was made with (recorded)")
    ap.add_argument("--command", default="", help="the exact command that made the checkpoint and ran this (recorded)")
    args = ap.parse_args()

    # Exact float32 everywhere: no TF32 tensor-core shortcuts in matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)

    os.makedirs(args.out, exist_ok=True)
    model = load_model(args.model, args.device)
    check_model(model, args.model)
    vocab = model.config.vocab_size
    cases = [run_case(model, args.device, n, L, s, pos, vocab, args.out, with_steps=(n == "short"))
             for n, (L, s, pos) in CASES.items()]

    import transformers

    machine = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"cpu ({platform.processor() or platform.machine()})"
    manifest = {
        "about": "Golden logits from Hugging Face transformers GptOssForCausalLM (float32, eager attention, eager "
                 "experts, MXFP4 experts dequantised) on a synthetic checkpoint; see tools/hf_parity.py for the "
                 "file formats and tests/model/test_parity.cpp for the comparison.",
        "checkpoint": {"preset": args.preset, "seed": args.seed, "layout": "hf",
                       "checksum": checkpoint_checksum(args.model)},
        "command": args.command or " ".join(sys.argv),
        "machine": machine,
        "device": args.device,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "rel_err_definition": "per row: max_i |ours_i - hf_i| / max_i |hf_i| over the row's ids",
        "cases": cases,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    for c in cases:
        print(f"{c['name']}: greedy {c['greedy_tokens'][:8]}... min top1-top2 margin "
              f"{min(c['top1_top2_margin_at_positions'] + c['greedy_top1_top2_margins']):.3f}, "
              f"router 4th-5th gaps {[round(g, 3) for g in c['router_4th_5th_min_gap_per_layer']]}")


if __name__ == "__main__":
    main()
