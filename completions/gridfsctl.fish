# fish completion for gridfsctl
#
# Built when fish loads it from what the binary says ('gridfsctl _complete
# [CMD]': each command and option with its short letter, argument kind, enum
# values and description), so an option added to a command is completed
# without editing this file. Stored names come from 'gridfsctl _names
# PREFIX', which lists a bounded number and gives up quickly.

# The command word on the line (the first word that is neither an option nor an option's argument).
function __gridfsctl_command
    set -l words (commandline -opc)
    set -e words[1]
    set -l skip 0
    for w in $words
        if test $skip -eq 1
            set skip 0
        else if string match -q -- '-*' $w
            contains -- $w $__gridfsctl_args_ && set skip 1
        else
            echo $w
            return 0
        end
    end
    return 1
end

function __gridfsctl_is -a cmd
    test "$(__gridfsctl_command)" = "$cmd"
end

# True when the command already has an operand before the cursor.
function __gridfsctl_has_operand
    set -l cmd (__gridfsctl_command) || return 1
    set -l takes __gridfsctl_args_$cmd
    set -l words (commandline -opc)
    set -l seen 0
    set -l skip 0
    for w in $words[2..-1]
        if test $skip -eq 1
            set skip 0
        else if string match -q -- '-*' $w
            contains -- $w $$takes && set skip 1
        else if test $seen -eq 1
            return 0
        else if test "$w" = "$cmd"
            set seen 1
        end
    end
    return 1
end

# The --uri, --db and --bucket of the line, for _names.
function __gridfsctl_globals
    set -l words (commandline -opc)
    set -l next 0
    for w in $words[2..-1]
        if test $next -eq 1
            echo $w
            set next 0
        else if string match -q -r -- '^--(uri|db|bucket)=' $w
            echo $w
        else if contains -- $w --uri --db --bucket
            echo $w
            set next 1
        end
    end
end

function __gridfsctl_names
    set -l tok (commandline -ct)
    set -l prefix (string unescape -- $tok 2>/dev/null; or echo $tok)
    command gridfsctl (__gridfsctl_globals) _names -- "$prefix" 2>/dev/null
end

# Registers one row of 'gridfsctl _complete' under the condition cond.
function __gridfsctl_register -a cond word short kind values desc
    set -l args -c gridfsctl -n $cond
    test "$desc" != - && set -a args -d $desc
    if test "$word" = @args
        switch $kind
            case file
                set -a args -F
            case dir
                set -a args -a '(__fish_complete_directories (commandline -ct))'
            case name
                set -a args -a '(__gridfsctl_names)'
            case enum
                set args -c gridfsctl -n "$cond && not __gridfsctl_has_operand" -a $values
            case command
                set -a args -a "$(string join ' ' $__gridfsctl_commands)"
            case '*'
                return
        end
        complete $args
        return
    end
    set -a args -l (string sub -s 3 -- $word)
    test "$short" != - && set -a args -s (string sub -s 2 -- $short)
    switch $kind
        case flag
        case file
            set -a args -r -F
        case dir
            set -a args -x -a '(__fish_complete_directories (commandline -ct))'
        case enum
            set -a args -x -a $values
        case '*'
            set -a args -x
    end
    complete $args
end

# Reads the rows for one command (or the top level) and registers them.
function __gridfsctl_load -a cmd cond
    set -l takes
    set -l which (string match -v -- '' $cmd) # the top level: no argument at all
    for row in (command gridfsctl _complete $which 2>/dev/null)
        set -l f (string split \t -- $row)
        test (count $f) -eq 5 || continue
        if test $f[3] = command -a $f[1] != @args
            set -a __gridfsctl_commands $f[1]
            complete -c gridfsctl -n 'not __gridfsctl_command' -f -a $f[1] -d $f[5]
            continue
        end
        if test $f[3] != flag -a $f[1] != @args
            set -a takes $f[1]
            test $f[2] != - && set -a takes $f[2]
        end
        __gridfsctl_register $cond $f
    end
    set -g __gridfsctl_args_$cmd $takes
end

complete -c gridfsctl -f
set -g __gridfsctl_commands
__gridfsctl_load '' 'not __gridfsctl_command'
for cmd in $__gridfsctl_commands
    __gridfsctl_load $cmd "__gridfsctl_is $cmd"
end
