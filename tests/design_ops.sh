#!/bin/bash
# docs/DESIGN.md §3 lists, to the letter, the ops a new backend defines: the block between the
# "seam ops" markers (indented two spaces, inside §3's list item) is generated from src/kernels/backend_ops.inc (each declaration's name and
# parameters, one line per op, in the file's order). Exits 1, printing the difference, when the
# block is not what the seam declares; with --write, rewrites the block in place.
# usage: design_ops.sh SOURCE_DIR [--write]
src=${1:?usage: design_ops.sh SOURCE_DIR [--write]}
inc=$src/src/kernels/backend_ops.inc
doc=$src/docs/DESIGN.md
begin='  <!-- seam ops: generated from src/kernels/backend_ops.inc by tests/design_ops.sh --write -->'
end='  <!-- end of seam ops -->'
for f in "$inc" "$doc"; do
  [ -f "$f" ] || { echo "design_ops.sh: no $f" >&2; exit 2; }
done

# One declaration per op: from a line starting with its return type to the line closing its
# parameter list, whitespace folded.
ops=$(awk '
  /^[A-Za-z]/ && /\(/ { decl = ""; open = 1 }
  open { line = $0; gsub(/^[ \t]+/, "", line); decl = decl (decl == "" ? "" : " ") line }
  open && /\);/ { sub(/;$/, "", decl); print decl; open = 0 }
' "$inc")
count=$(echo "$ops" | wc -l)
generated=$(
  echo "$begin"
  echo "  The $count ops of \`src/kernels/backend_ops.inc\`, as a backend defines them:"
  echo
  echo '  ```cpp'
  echo "$ops" | sed 's/^/  /'
  echo '  ```'
  echo "$end"
)

current=$(awk -v b="$begin" -v e="$end" '$0 == b { on = 1 } on { print } $0 == e { on = 0 }' "$doc")
if [ "${2:-}" = "--write" ]; then
  [ -n "$current" ] || { echo "design_ops.sh: no seam ops block in $doc" >&2; exit 2; }
  tmp=$(mktemp "$doc.XXXXXX")
  awk -v b="$begin" -v e="$end" -v g="$generated" '
    $0 == b { print g; skip = 1; next }
    skip && $0 == e { skip = 0; next }
    !skip { print }
  ' "$doc" > "$tmp" && mv "$tmp" "$doc"
  echo "design_ops.sh: $count ops written into $doc"
  exit 0
fi
if [ "$current" != "$generated" ]; then
  echo "docs/DESIGN.md's seam ops differ from src/kernels/backend_ops.inc (run tests/design_ops.sh . --write):"
  diff <(echo "$current") <(echo "$generated")
  exit 1
fi
echo "docs/DESIGN.md lists the seam's $count ops as backend_ops.inc declares them"
