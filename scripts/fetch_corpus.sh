#!/usr/bin/env bash
# Writes the bundled default corpus: the King James Bible (public domain text, from
# Debian's bible-kjv package, installed by scripts/setup.sh), one chapter per document
# (documents are separated by blank lines), verse references removed.
# Usage: scripts/fetch_corpus.sh OUT_FILE
set -euo pipefail
out=${1:?usage: fetch_corpus.sh OUT_FILE}
if ! command -v bible >/dev/null; then
  echo "fetch_corpus: 'bible' not found; run scripts/setup.sh (package bible-kjv)" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
# Lines look like "Ge1:1 In the beginning ..." (book, chapter:verse, text). A new
# chapter starts a new document.
bible -f "Gen1:1-Rev22:21" | awk '
  match($0, /^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ /) {
    ref = substr($0, 1, RLENGTH - 1); text = substr($0, RLENGTH + 1)
    split(ref, parts, ":"); chapter = parts[1]
    if (chapter != last && NR > 1) printf "\n\n"
    else if (NR > 1) printf " "
    printf "%s", text; last = chapter; next
  }
  { printf " %s", $0 }
  END { printf "\n" }' > "$tmp"
mv "$tmp" "$out"
echo "fetch_corpus: wrote $out ($(wc -c < "$out") bytes)" >&2
