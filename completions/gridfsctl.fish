# fish completion for gridfsctl. Options come from 'gridfsctl _options CMD'.

set -l commands ls get put rm stat import verify mirror watch serve supervise help

function __gridfsctl_options
    set -l cmd (commandline -opc)[2]
    for o in (gridfsctl _options $cmd 2>/dev/null)
        echo (string replace -r '=$' '=' -- $o)
    end
end

complete -c gridfsctl -f
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a ls -d 'list files in the bucket'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a get -d 'write a stored file to disk or stdout'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a put -d 'store a file'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a rm -d 'remove files'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a stat -d "show one file's document"
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a import -d 'bulk-load a directory tree'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a verify -d 'check stored files for damage'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a mirror -d 'write the bucket back to a disk tree'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a watch -d 'keep the bucket in sync with a directory'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a serve -d 'serve files over HTTP'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a supervise -d 'run and restart backends and servers'
complete -c gridfsctl -n "not __fish_seen_subcommand_from $commands" -a help -d 'help for a command'

complete -c gridfsctl -l uri -r -d 'connection string'
complete -c gridfsctl -l db -r -d 'database'
complete -c gridfsctl -l bucket -r -d 'bucket name'
complete -c gridfsctl -s q -l quiet -d 'print only errors'
complete -c gridfsctl -l no-progress -d 'never draw a progress bar'
complete -c gridfsctl -s h -l help -d 'help'

complete -c gridfsctl -n "__fish_seen_subcommand_from $commands" -a '(__gridfsctl_options)'
complete -c gridfsctl -n "__fish_seen_subcommand_from import mirror watch" -a '(__fish_complete_directories)'
complete -c gridfsctl -n "__fish_seen_subcommand_from put" -F
complete -c gridfsctl -n "__fish_seen_subcommand_from get rm stat ls" -a '(timeout 2 gridfsctl ls --no-progress -- (commandline -ct) 2>/dev/null)'
complete -c gridfsctl -n "__fish_seen_subcommand_from supervise" -a 'status restart stop'
complete -c gridfsctl -n "__fish_seen_subcommand_from help" -a "$commands"
