# bash completion for gridfsctl
# Options come from the binary itself ('gridfsctl _options CMD'), so they never drift from --help.

_gridfsctl_names()
{
	# Stored names, when the backend answers quickly; nothing otherwise.
	timeout 2 gridfsctl ls --no-progress -- "$1" 2>/dev/null
}

_gridfsctl()
{
	local cur prev words cword
	_init_completion -n = || return
	local commands="ls get put rm stat import verify mirror watch serve supervise help"
	local globals="--uri= --db= --bucket= --quiet --no-progress --help --version"

	local i cmd=""
	for ((i = 1; i < cword; i++)); do
		case ${words[i]} in
		--uri | --db | --bucket) ((i++)) ;;
		-*) ;;
		*) cmd=${words[i]}; break ;;
		esac
	done

	case $prev in
	-o | --output | -c | --config | --access-log) _filedir; return ;;
	--against | --to) _filedir -d; return ;;
	--uri | --db | --bucket | --type | -t | --name | -n | --prefix | --listen | --id) return ;;
	esac

	if [[ -z $cmd ]]; then
		if [[ $cur == -* ]]; then
			COMPREPLY=($(compgen -W "$globals" -- "$cur"))
		else
			COMPREPLY=($(compgen -W "$commands" -- "$cur"))
		fi
		[[ ${COMPREPLY-} == *= ]] && compopt -o nospace
		return
	fi

	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$(gridfsctl _options "$cmd" 2>/dev/null) $globals" -- "$cur"))
		[[ ${COMPREPLY-} == *= ]] && compopt -o nospace
		return
	fi

	case $cmd in
	import | mirror | watch) _filedir -d ;;
	put) _filedir ;;
	get | rm | stat | ls) COMPREPLY=($(compgen -W "$(_gridfsctl_names "$cur")" -- "$cur")) ;;
	help) COMPREPLY=($(compgen -W "$commands" -- "$cur")) ;;
	supervise) COMPREPLY=($(compgen -W "status restart stop" -- "$cur")) ;;
	esac
}
complete -F _gridfsctl gridfsctl
