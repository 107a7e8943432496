#!/usr/bin/env bash
# LLaVA-1.5 checkpoints end to end, one fixture per naming generation: the original layout
# (LlavaLlamaForCausalLM without its tower, which comes from a CLIP folder through
# model.vision.init; image_aspect_ratio "pad"), llava-hf's (CLIP tower) and that of
# transformers >= 4.52 (SigLIP tower). Each imports, trains with the llava_v1 template on one
# rank and on 3 MPI ranks with dhp's rings (the same losses and weights to fp32 rounding), is
# exported to the llava-hf layout, and the export imported and exported again gives the same
# bytes. The tensors that the run trained all changed; the tower's parts LLaVA never runs
# (its last layer, post_layernorm, SigLIP's head) are held, named in the log, and exported
# as they came. Then LLaVA's stage 1 composed from a
# Llama decoder and a SigLIP tower: only the fresh projector trains, on 3 ranks with the plain
# template, and the export's decoder and tower are the folders' bytes.
#   tests/mpi_hf_llava_towers.sh DHP_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/mpi_lib.sh" "$1"
src=$2
decoder=(--hidden 64 --heads 4 --kv 2 --layers 2 --ffn 128 --vocab 320 --tokenizer --seed 7)

hf_fixture make_hf_llava_fixture.py "$work/orig" llava_orig --no-tower "${decoder[@]}" --dtype bf16
hf_fixture make_hf_llava_fixture.py "$work/clip" clip_vision --seed 8 --dtype bf16
hf_fixture make_hf_llava_fixture.py "$work/hf" llava_hf --tower clip "${decoder[@]}"
hf_fixture make_hf_llava_fixture.py "$work/new" llava_new --tower siglip --feature-layer -1 "${decoder[@]}"
"$dhp" data synth --out "$work/data" --preset mixed --train 96 --val 8 --seed 5 \
  --scale 0.1 --factor 16 >/dev/null
quiet_run_toml | small_run_toml "$work/data" 4 "" 'template = "llava_v1"' > "$work/run.toml"

for gen in orig hf new; do
  start=(--config "$work/run.toml" --model.init="$work/$gen" --data.tokenizer="$work/$gen")
  if [ "$gen" = orig ]; then
    # The original layout names its tower without describing it.
    start+=(--model.vision.init="$work/clip" --model.vision.arch=clip --model.vision.patch=4
            --model.vision.image_size=16)
  fi
  train_run "$work/$gen-one.log" -- "${start[@]}" --log.metrics="$work/$gen-one/metrics.jsonl" \
    --checkpoint.dir="$work/$gen-one/ckpt"
  grep -q "imported .* tensors" "$work/$gen-one.log" \
    || { echo "$gen: nothing imported"; cat "$work/$gen-one.log"; exit 1; }
  # clip (orig, hf; feature layer -2): the last layer and post_layernorm; siglip (new; feature
  # layer -1): post_layernorm and the pooling head.
  held="its layers after feature_layer, post_layernorm"
  [ "$gen" = new ] && held="post_layernorm, pooling head"
  grep -q "the tower's parts LLaVA never runs: $held (" "$work/$gen-one.log" \
    || { echo "$gen: the held parts are not named"; grep -i frozen "$work/$gen-one.log"; exit 1; }
  export_weights "$work/$gen-one"
  r="$work/$gen-dhp-3"
  train_run "$r.log" mpirun -np 3 --oversubscribe -- "${start[@]}" --parallel.strategy=dhp \
    --log.metrics="$r/metrics.jsonl" --checkpoint.dir="$r/ckpt"
  export_weights "$r"
  export_hf "$r/ckpt" "$work/$gen-e1"
  export_hf "$work/$gen-e1" "$work/$gen-e2"
done
# Compose (LLaVA's stage 1): a Llama decoder and a SigLIP tower, the projector fresh and the
# only group that trains, the plain template; on 3 ranks, then exported.
hf_fixture make_hf_fixture.py "$work/dec" "${decoder[@]}" --dtype bf16
hf_fixture make_hf_llava_fixture.py "$work/siglip" siglip_vision --seed 9 --dtype bf16
r="$work/compose-dhp-3"
train_run "$r.log" mpirun -np 3 --oversubscribe -- --config "$work/run.toml" \
  --model.init="$work/dec" --data.tokenizer="$work/dec" --model.vision.init="$work/siglip" \
  --model.vision.merge=1 --data.template=plain --optim.groups.language.trainable=false \
  --optim.groups.embeddings.trainable=false --optim.groups.vision.trainable=false \
  --parallel.strategy=dhp --log.metrics="$r/metrics.jsonl" --checkpoint.dir="$r/ckpt"
grep -q "kept their seeded initialisation (4 tensors not in the checkpoint): projector.fc1.weight" "$r.log" \
  || { echo "compose: the projector is not the only seeded part"; grep -i "seeded" "$r.log"; exit 1; }
export_hf "$r/ckpt" "$work/compose-e1"
grep -Eq "model.vision.resize += \"?pad_square" "$work/orig-one.log" \
  || { echo "image_aspect_ratio pad did not set pad_square"; grep resize "$work/orig-one.log"; exit 1; }

/usr/bin/python3 - "$tests/reference" "$work" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from mpi_runs import safetensors, same_losses, same_weights, steps, weights
work = sys.argv[2]
rings = 0
for gen, tower in (("orig", "clip"), ("hf", "clip"), ("new", "siglip")):
    one, three = steps(f"{work}/{gen}-one"), steps(f"{work}/{gen}-dhp-3")
    same_losses(one, three, f"{gen}: dhp on 3 ranks", 4)
    same_weights(weights(f"{work}/{gen}-one"), weights(f"{work}/{gen}-dhp-3"), f"{gen}: dhp on 3 ranks")
    widest = max(r["max_degree"] for r in three)
    rings += widest > 1
    e1, e2 = (safetensors(f"{work}/{gen}-{e}/model.safetensors") for e in ("e1", "e2"))
    assert e1.keys() == e2.keys()
    for k in e1:
        assert e1[k] == e2[k], f"{gen}: {k}: the re-import's export differs"
    cfg = json.load(open(f"{work}/{gen}-e1/config.json"))
    assert cfg["architectures"] == ["LlavaForConditionalGeneration"], cfg["architectures"]
    assert cfg["vision_config"]["model_type"] == f"{tower}_vision_model", cfg["vision_config"]
    # Every key comes back the same, max_position_embeddings (the source's) and top-level
    # pad_token_id (llava-hf's place) included.
    cfg2 = json.load(open(f"{work}/{gen}-e2/config.json"))
    assert cfg == cfg2, (cfg, cfg2)
    src_cfg = json.load(open(f"{work}/{gen}/config.json"))
    src_text = src_cfg.get("text_config", src_cfg)
    assert cfg["text_config"]["max_position_embeddings"] == src_text["max_position_embeddings"]
    assert "pad_token_id" in cfg, cfg
    pre1 = open(f"{work}/{gen}-e1/preprocessor_config.json").read()
    assert pre1 == open(f"{work}/{gen}-e2/preprocessor_config.json").read()
    assert json.loads(pre1).get("do_pad", False) == (gen == "orig"), pre1
    assert json.load(open(f"{work}/{gen}-e1/added_tokens.json"))["<image>"] == cfg["image_token_index"]
    if gen == "hf":  # the source's names are llava-hf's: every tensor the features reach trained
        src = safetensors(f"{work}/hf/model.safetensors")
        assert all(k in src for k in e1)
        # The tower's last layer runs after hidden_states[-2], and post_layernorm after it: they
        # take no gradient, moments or weight decay, so their 18 tensors are the file's bytes,
        # and nothing else is; every tensor of the source is in the export.
        unused = ("vision_tower.vision_model.encoder.layers.2.", "vision_tower.vision_model.post_layernorm.")
        kept = [k for k in e1 if e1[k][2] == src[k][2]]
        assert all(k.startswith(unused) for k in kept), kept
        assert len(kept) == 18, kept  # q/k/v/out, fc1/fc2, two LayerNorms (weights, biases); post_layernorm
        missing = [k for k in src if k not in e1 and "position_ids" not in k]
        assert not missing, missing
    names = [k for k in e1 if k.startswith(("multi_modal_projector.", "vision_tower.", "language_model."))]
    assert len(names) == len(e1), sorted(set(e1) - set(names))
    print(f"{gen} ({tower}): losses {', '.join('%.5f' % r['loss'] for r in three)} on 3 ranks as on 1; "
          f"widest ring {widest}; export -> import -> export: {len(e1)} tensors byte-identical")
assert rings >= 1, "no run put a sample on a ring: the data does not exercise ring attention"
# Stage 1 moved the projector only: the decoder's and tower's bytes are their folders'.
e1 = safetensors(f"{work}/compose-e1/model.safetensors")
dec, tower = safetensors(f"{work}/dec/model.safetensors"), safetensors(f"{work}/siglip/model.safetensors")
same = 0
for k, v in e1.items():
    if k.startswith("multi_modal_projector."):
        continue
    src = dec[k.replace("language_model.", "", 1)] if k.startswith("language_model.") \
        else tower[k.replace("vision_tower.", "", 1)]
    assert v == src, f"compose: frozen {k} changed"
    same += 1
proj = [k for k in e1 if k.startswith("multi_modal_projector.")]
assert len(proj) == 4, proj
losses = [r["loss"] for r in steps(f"{work}/compose-dhp-3")]
print(f"compose (stage 1): {same} frozen tensors exported as imported, 4 projector tensors trained; "
      f"losses {', '.join('%.5f' % l for l in losses)}")
PY
echo "LLaVA-1.5 in each naming generation trains on 1 and 3 ranks alike and exports round-trip"
