#!/bin/bash
# torchhpc's container environment expansion: name patterns (SLURM_*) become runtime flags when the task
# starts (argv cannot expand a pattern: the job's variables exist only on the compute node).
# Usage: bash env.sh MODE ARG N PATTERN... M HEAD... TAIL...
#   MODE flag:   ARG NAME for each matching variable (docker -e NAME, enroot --env NAME), between HEAD and TAIL
#   MODE export: export ARG$NAME=$VALUE (APPTAINERENV_NAME survives --cleanenv)
# Inputs are positional parameters, never program text.
mode=$1 arg=$2 n=$3
shift 3
pats=("${@:1:n}")
shift "$n"
m=$1
shift
head=("${@:1:m}")
shift "$m"
flags=()
for v in $(compgen -e); do
  for p in "${pats[@]}"; do
    # shellcheck disable=SC2254  # $p is a glob on purpose
    case $v in $p)
      if [ "$mode" = export ]; then export "$arg$v=${!v}"; else flags+=("$arg" "$v"); fi
      break ;;
    esac
  done
done
exec "${head[@]}" "${flags[@]}" "$@"
