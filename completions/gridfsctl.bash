# bash completion for gridfsctl
#
# What to offer comes from the binary, so an option added to a command is
# completed without editing this file: 'gridfsctl _complete [CMD]' lists the
# commands, or CMD's options with their short letter, argument kind (file,
# dir, number, enum, name, string), enum values and a description, and what
# CMD's operands are; 'gridfsctl _names PREFIX' lists a bounded number of
# stored names and gives up quickly when the backend does not answer.

# Reads 'gridfsctl _complete [CMD]' into the _gfs_* arrays, one entry a word.
_gridfsctl_spec()
{
	_gfs_word=() _gfs_short=() _gfs_kind=() _gfs_values=()
	local w s k v d
	while IFS=$'\t' read -r w s k v d; do
		_gfs_word+=("$w") _gfs_short+=("$s") _gfs_kind+=("$k") _gfs_values+=("$v")
	done < <(command gridfsctl _complete ${1:+"$1"} 2>/dev/null)
}

# The index in _gfs_* of option $1 (long or short), or nothing.
_gridfsctl_find()
{
	local j
	[[ $1 == - ]] && return
	for j in "${!_gfs_word[@]}"; do
		if [[ ${_gfs_word[j]} == "$1" || ${_gfs_short[j]} == "$1" ]]; then
			echo "$j"
			return
		fi
	done
}

# The word as typed, without the backslashes and quotes that protect it.
_gridfsctl_unquote()
{
	local p=${1#[\"\']} out=""
	while [[ $p == *\\* ]]; do
		out+=${p%%\\*}
		p=${p#*\\}
		out+=${p:0:1}
		p=${p:1}
	done
	printf '%s' "$out$p"
}

# Stored names starting with the word being completed, each quoted as one word.
_gridfsctl_names()
{
	local n q
	COMPREPLY=()
	while IFS= read -r n; do
		printf -v q '%q' "$n"
		COMPREPLY+=("$q")
	done < <(command gridfsctl "${_gfs_globals[@]}" _names -- "$(_gridfsctl_unquote "$1")" 2>/dev/null)
}

# Completes an argument of kind $1 (enum values $2) for the word $3.
_gridfsctl_argument()
{
	case $1 in
	file) _filedir ;;
	dir) _filedir -d ;;
	enum) COMPREPLY=($(compgen -W "$2" -- "$3")) ;;
	name) _gridfsctl_names "$3" ;;
	command)
		_gridfsctl_spec
		local j cmds=""
		for j in "${!_gfs_word[@]}"; do
			[[ ${_gfs_kind[j]} == command ]] && cmds+=" ${_gfs_word[j]}"
		done
		COMPREPLY=($(compgen -W "$cmds" -- "$3"))
		;;
	*) COMPREPLY=() ;;
	esac
}

_gridfsctl()
{
	local cur prev words cword split
	_init_completion -s -n : || return

	# The command, the globals to pass on to _names, and the operands before the cursor.
	local i j w cmd="" dashdash=0 operands=0
	_gfs_globals=()
	_gridfsctl_spec
	for ((i = 1; i < cword; i++)); do
		w=${words[i]}
		if [[ $w == -- ]]; then
			dashdash=$i
			break
		fi
		case $w in
		--uri=* | --db=* | --bucket=*) _gfs_globals+=("$w") ;;
		--uri | --db | --bucket) _gfs_globals+=("$w" "${words[i + 1]}") ;;
		esac
		if [[ $w == -* ]]; then
			j=$(_gridfsctl_find "$w")
			[[ -n $j && ${_gfs_kind[j]} != flag ]] && ((i++))
		elif [[ -z $cmd ]]; then
			cmd=$w
			_gridfsctl_spec "$cmd"
		else
			((operands++))
		fi
	done

	# supervise -- CMD ARGS...: complete the program's own command line.
	if ((dashdash > 0)); then
		_command_offset $((dashdash + 1))
		return
	fi

	if [[ $prev == -* ]]; then
		j=$(_gridfsctl_find "$prev")
		if [[ -n $j && ${_gfs_kind[j]} != flag ]]; then
			_gridfsctl_argument "${_gfs_kind[j]}" "${_gfs_values[j]}" "$cur"
			return
		fi
	fi
	$split && return

	if [[ $cur == -* ]]; then
		local opts=()
		for j in "${!_gfs_word[@]}"; do
			w=${_gfs_word[j]}
			[[ $w == --* ]] || continue
			[[ ${_gfs_kind[j]} == flag ]] || w+="="
			opts+=("$w")
		done
		COMPREPLY=($(compgen -W "${opts[*]}" -- "$cur"))
		[[ ${COMPREPLY-} == *= ]] && compopt -o nospace
		return
	fi

	if [[ -z $cmd ]]; then
		_gridfsctl_argument command "" "$cur"
		return
	fi
	j=$(_gridfsctl_find @args)
	[[ -n $j ]] || return
	# An enum operand (supervise's action) is only the first one.
	[[ ${_gfs_kind[j]} == enum ]] && ((operands > 0)) && return
	_gridfsctl_argument "${_gfs_kind[j]}" "${_gfs_values[j]}" "$cur"
	__ltrim_colon_completions "$cur"
}
complete -F _gridfsctl gridfsctl
