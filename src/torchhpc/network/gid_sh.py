"""RoCE GID detection as plain POSIX shell, for pods whose image has no torchhpc (the RunAI on RCP guide).

Seed 004's key step sets ``NCCL_IB_GID_INDEX`` from the pod's sysfs. The
Python detector (``torchhpc net detect``, :mod:`torchhpc.network.select`)
needs torchhpc in the image; a RunAI user runs someone else's image (NGC,
the lab's), so at pod start the same rule runs as shell text that uses only
shell builtins (``read``, globs, ``$(( ))``, ``printf``; ``getent`` when
``MASTER_ADDR`` is a name): dash, busybox sh and bash all run it.

The rule is :func:`torchhpc.network.select.pick_gid`'s: active ports
(``state`` ACTIVE, ``phys_state`` LinkUp); on RoCE ports the ``RoCE v2``
GIDs, IPv4-mapped first (else global IPv6, else link-local); several of
them: the one on the netdev that routes to ``MASTER_ADDR`` (``/proc/net/route``,
longest prefix; then that VLAN's base and a bond's slaves), then the one in
the master's /24, then the first. One index for all HCAs (the most common,
ties to the routing port, then the lowest); ports that disagree leave
``NCCL_IB_HCA``. Values are exported only when not already set (a profile's
``NCCL_IB_HCA=mlx5`` wins). Nothing found: one warning line on stderr.
``TORCHHPC_SYSFS`` is a root prefix, for tests (tests/data/sysfs/*).
Unlike the Python detector it routes only IPv4 masters; an IPv6 or
unresolvable master falls back to the default route's interface.
"""

from __future__ import annotations

__all__ = ["GID_DETECT_SH", "one_line"]

GID_DETECT_SH = r"""# torchhpc: NCCL_IB_GID_INDEX / NCCL_IB_HCA from this pod's sysfs (net detect's rule, POSIX sh)
_th_gid_detect() {
  _th_r=${TORCHHPC_SYSFS:-} _th_m=${MASTER_ADDR:-} _th_mi=0 _th_m24=
  _th_rd() { _th_v=; if [ -r "$1" ]; then { read -r _th_v || :; } 2>/dev/null <"$1"; fi; }
  case $_th_m in
    *[!0-9.]*|'') if [ -n "$_th_m" ] && command -v getent >/dev/null 2>&1; then
        _th_m=$(getent ahostsv4 "$_th_m" 2>/dev/null) || _th_m=; _th_m=${_th_m%%[!0-9.]*}
      else _th_m=; fi ;;
  esac
  if [ -n "$_th_m" ]; then
    _th_ifs=$IFS; IFS=.; set -- $_th_m; IFS=$_th_ifs
    _th_mi=$(( $1 | $2 << 8 | $3 << 16 | $4 << 24 )); _th_m24=$(printf '%02x%02x:%02x' "$1" "$2" "$3")
  fi
  # the netdev the pod uses: the route to the master, longest prefix (no master: the default route)
  _th_rif= _th_best=-1 _th_bm=0
  if [ -r "$_th_r/proc/net/route" ]; then
    while read -r _th_i _th_d _th_g _th_f _th_x _th_y _th_me _th_k _th_z; do
      case $_th_d in *[!0-9A-Fa-f]*|'') continue ;; esac
      [ $(( 0x$_th_f & 1 )) = 1 ] && [ $(( 0x$_th_f & 512 )) = 0 ] || continue
      [ $(( _th_mi & 0x$_th_k )) = $(( 0x$_th_d )) ] || continue
      if [ $(( 0x$_th_k )) -gt "$_th_best" ] || { [ $(( 0x$_th_k )) = "$_th_best" ] && [ "$_th_me" -lt "$_th_bm" ]; }; then
        _th_rif=$_th_i _th_best=$(( 0x$_th_k )) _th_bm=$_th_me
      fi
    done <"$_th_r/proc/net/route"
  fi
  _th_pref=
  if [ -n "$_th_rif" ]; then
    _th_rd "$_th_r/sys/class/net/${_th_rif%%.*}/bonding/slaves"
    _th_pref=" $_th_rif ${_th_rif%%.*} $_th_v "
  fi
  # devices and ports in natural order (mlx5_2 before mlx5_10): by length, then as globbed
  _th_ib=$_th_r/sys/class/infiniband _th_devs=
  for _th_l in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24; do
    for _th_p in "$_th_ib"/*; do
      _th_n=${_th_p##*/}; [ -d "$_th_p" ] && [ "${#_th_n}" = "$_th_l" ] && _th_devs="$_th_devs $_th_n"
    done
  done
  _th_ports= _th_roce= _th_usable=
  for _th_n in $_th_devs; do
    for _th_l in 1 2 3 4 5 6 7 8 9; do
      _th_pd=$_th_ib/$_th_n/ports/$_th_l; [ -d "$_th_pd" ] || continue
      _th_rd "$_th_pd/state"; case $_th_v in *ACTIVE*) ;; *) continue ;; esac
      _th_rd "$_th_pd/phys_state"; case ${_th_v#*: } in ''|LinkUp|linkup) ;; *) continue ;; esac
      _th_ports="$_th_ports $_th_n:$_th_l"
      _th_rd "$_th_pd/link_layer"; [ "$_th_v" = Ethernet ] || continue
      _th_roce="$_th_roce $_th_n:$_th_l"
      # this port's RoCE v2 GIDs, by family: IPv4-mapped, global IPv6, link-local
      _th_v4= _th_v6= _th_ll= _th_nd= _th_j=0 _th_max=0
      for _th_p in "$_th_pd"/gids/*; do
        _th_p=${_th_p##*/}; case $_th_p in *[!0-9]*|'') ;; *) [ "$_th_p" -gt "$_th_max" ] && _th_max=$_th_p ;; esac
      done
      while [ "$_th_j" -le "$_th_max" ]; do
        _th_rd "$_th_pd/gids/$_th_j"; _th_gv=$_th_v
        _th_rd "$_th_pd/gid_attrs/types/$_th_j"; _th_t=$_th_v
        _th_rd "$_th_pd/gid_attrs/ndevs/$_th_j"; _th_dv=$_th_v
        case $_th_gv in ''|0000:0000:0000:0000:0000:0000:0000:0000) _th_j=$((_th_j + 1)); continue ;; esac
        [ -n "$_th_dv" ] && _th_nd="$_th_nd $_th_dv "
        case $_th_t in [Rr][Oo][Cc][Ee]' '[Vv]2) case $_th_gv in
            0000:0000:0000:0000:0000:ffff:*) _th_v4="$_th_v4 $_th_j/${_th_dv:--}/${_th_gv#0000:0000:0000:0000:0000:ffff:}" ;;
            fe80:*) _th_ll="$_th_ll $_th_j/${_th_dv:--}/-" ;;
            *) _th_v6="$_th_v6 $_th_j/${_th_dv:--}/-" ;;
          esac ;;
        esac
        _th_j=$((_th_j + 1))
      done
      _th_pool=${_th_v4:-${_th_v6:-$_th_ll}}
      [ -n "$_th_pool" ] || continue
      set -- $_th_pool; _th_pick=${1%%/*}
      if [ $# -gt 1 ]; then
        _th_found=
        for _th_dv in $_th_pref; do
          for _th_e in "$@"; do
            _th_x=${_th_e#*/}; if [ "${_th_x%%/*}" = "$_th_dv" ]; then _th_pick=${_th_e%%/*} _th_found=1; break; fi
          done
          [ -n "$_th_found" ] && break
        done
        if [ -z "$_th_found" ] && [ -n "$_th_m24" ] && [ -n "$_th_v4" ]; then
          for _th_e in "$@"; do
            case ${_th_e##*/} in "$_th_m24"*) _th_pick=${_th_e%%/*}; break ;; esac
          done
        fi
      fi
      _th_routing=0; for _th_dv in $_th_pref; do case $_th_nd in *" $_th_dv "*) _th_routing=1 ;; esac; done
      [ -n "$_th_v4" ] || _th_pick="$_th_pick/6"
      _th_usable="$_th_usable $_th_n:$_th_l=$_th_pick=$_th_routing"
    done
  done
  if [ -z "$_th_ports" ]; then
    echo "torchhpc: no active RDMA port under $_th_ib: NCCL_IB_GID_INDEX/NCCL_IB_HCA not set, NCCL may use TCP sockets" >&2
    return 0
  fi
  _th_index= _th_fam=
  if [ -n "$_th_roce" ]; then
    if [ -z "$_th_usable" ]; then
      echo "torchhpc: RoCE ports without a usable RoCE v2 GID ($_th_roce ): NCCL_IB_GID_INDEX not set; check the port's IP configuration" >&2
      return 0
    fi
    # one index for every HCA: the most common; ties to the port on the routing netdev, then the lowest
    _th_bc=0 _th_br=0
    for _th_e in $_th_usable; do
      _th_x=${_th_e#*=}; _th_i=${_th_x%%=*}; _th_i=${_th_i%/6}; _th_c=0 _th_rt=0
      for _th_f in $_th_usable; do
        _th_y=${_th_f#*=}; _th_y=${_th_y%%=*}
        if [ "${_th_y%/6}" = "$_th_i" ]; then _th_c=$((_th_c + 1)); [ "${_th_f##*=}" = 1 ] && _th_rt=1; fi
      done
      if [ -z "$_th_index" ] || [ "$_th_c" -gt "$_th_bc" ] || { [ "$_th_c" = "$_th_bc" ] && {
           [ "$_th_rt" -gt "$_th_br" ] || { [ "$_th_rt" = "$_th_br" ] && [ "$_th_i" -lt "$_th_index" ]; }; }; }; then
        _th_index=$_th_i _th_bc=$_th_c _th_br=$_th_rt _th_fam=${_th_x%%=*}
      fi
    done
    # RoCE ports with another index (or none) leave NCCL_IB_HCA
    _th_keep=
    for _th_p in $_th_ports; do
      case " $_th_roce " in *" $_th_p "*) case " $_th_usable " in *" $_th_p=$_th_index="*|*" $_th_p=$_th_index/6="*) ;; *) continue ;; esac ;;
      esac
      _th_keep="$_th_keep $_th_p"
    done
    _th_ports=$_th_keep
  fi
  # exact match (=) when one device name is a prefix of another (mlx5_1, mlx5_10)
  _th_hca= _th_eq=
  for _th_p in $_th_ports; do
    _th_hca="$_th_hca,$_th_p"
    for _th_n in $_th_devs; do
      case $_th_n in "${_th_p%:*}") ;; "${_th_p%:*}"*) _th_eq== ;; esac
    done
  done
  _th_hca=$_th_eq${_th_hca#,}
  if [ -n "$_th_index" ]; then [ -n "${NCCL_IB_GID_INDEX+x}" ] || export NCCL_IB_GID_INDEX="$_th_index"; fi
  case $_th_fam in */6) [ -n "${NCCL_SOCKET_FAMILY+x}" ] || export NCCL_SOCKET_FAMILY=AF_INET6 ;; esac
  [ -n "${NCCL_IB_HCA+x}" ] || export NCCL_IB_HCA="$_th_hca"
}
_th_gid_detect
unset -f _th_gid_detect _th_rd"""


_JOIN_WITH_SPACE = ("then", "do", "else", "{", " in", ";;", "||", "&&")


def one_line(script: str = GID_DETECT_SH) -> str:
    """``script`` as one line (comments dropped), for commands that go through another shell's parsing.

    RunAI joins the words after ``--`` and the pod's shell parses them again;
    one line keeps that second layer a plain double-quoted string. A line that
    ends in a word that takes the next command (``then``, ``do``, ``{``, ``in``,
    ``;;``, ``&&``; no line of the script ends in a bare case pattern) is joined with a space, any other with ``;``.
    """
    lines = [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    out = ""
    for ln in lines:
        if out:
            out += " " if out.endswith(_JOIN_WITH_SPACE) else "; "
        out += ln
    return out
