#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The layering of the folders: each may include headers of the folders before it in this order,
# and of its own, never of one after it (README, "Layout"):
#   core (with cuda, its GPU backend) <- proto <- text <- model <- spec <- worker <- coordinator <- cli
# tests/ and tools/ may include anything. Exits 1 naming every include that breaks the order.
# usage: tools/check_layers.sh [SOURCE_DIR]
set -u
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
order=(core proto text model spec worker coordinator cli)
declare -A level
for i in "${!order[@]}"; do level[${order[$i]}]=$i; done
level[cuda]=${level[core]}
bad=0
for dir in "${!level[@]}"; do
  [ -d "$src/$dir" ] || continue
  mine=${level[$dir]}
  while IFS=: read -r file line inc; do
    target=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z_]*\)\/.*/\1/p' <<<"$inc")
    [ -n "$target" ] || continue
    [ -n "${level[$target]+x}" ] || continue
    if [ "${level[$target]}" -gt "$mine" ]; then
      echo "layering: ${file#"$src"/}:$line includes ${target}/ (after ${dir}/ in: ${order[*]})"
      bad=1
    fi
  done < <(grep -rn --include='*.c' --include='*.h' --include='*.cu' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$src/$dir")
done
[ "$bad" = 0 ] && echo "layering: ok (${order[*]})"
exit "$bad"
