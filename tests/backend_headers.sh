#!/bin/bash
# A backend is one folder (docs/DESIGN.md §3): no file outside src/kernels/NAME/ includes a
# header of it, except src/kernels/ops.cpp, which builds the table of backends. Prints each
# offending include and exits 1; usage: backend_headers.sh SOURCE_DIR
src=${1:?usage: backend_headers.sh SOURCE_DIR}/src
status=0
for dir in "$src"/kernels/*/; do
  name=$(basename "$dir")
  hits=$(grep -rn --include='*.h' --include='*.cpp' --include='*.inc' "#include \"kernels/$name/" \
    "$src" | grep -v "^$src/kernels/$name/" | grep -v "^$src/kernels/ops.cpp:")
  if [ -n "$hits" ]; then
    echo "outside kernels/$name/, a header of the $name backend is included:"
    echo "$hits" | sed "s#^$src/#  src/#"
    status=1
  fi
done
[ $status = 0 ] && echo "no backend header is included outside its folder ($(ls -d "$src"/kernels/*/ | wc -l) backends)"
exit $status
