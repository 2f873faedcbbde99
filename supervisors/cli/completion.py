"""`actor-run completion bash|zsh`: a static completion script, generated from the argparse parser
itself, so every command and option (a new one included) completes without anyone editing it.

    actor-run completion bash > ~/.local/share/bash-completion/completions/actor-run
    actor-run completion zsh > "${fpath[1]}/_actor-run"

The script knows the command tree: `actor-run con<TAB>` gives `config`, `actor-run config <TAB>`
gives `show`, `actor-run run --<TAB>` gives run's options; elsewhere it completes file names.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any, NamedTuple

EPILOG = """\
examples:
  actor-run completion bash > ~/.local/share/bash-completion/completions/actor-run
  actor-run completion zsh > ~/.zfunc/_actor-run    # with fpath+=(~/.zfunc) before compinit
  eval "$(actor-run completion bash)"               # this shell only
"""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    c = sub.add_parser("completion", help="print a shell completion script", epilog=EPILOG,
                       description="Print a completion script for bash or zsh, made from this command's own parser.")
    c.add_argument("shell", choices=["bash", "zsh"], help="the shell the script is for")


class Node(NamedTuple):
    words: list[str]  # its options, its subcommands, its positionals' choices
    files: bool  # a positional that is a path (no choices): file names complete too
    takes_value: list[str]  # options followed by a value (a path, a number): after them, file names


def tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Node]:
    """What completes at each command path (`()`, `("run",)`, `("config", "show")`)."""
    words: list[str] = []
    values: list[str] = []
    files = False
    out: dict[tuple[str, ...], Node] = {}
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                words.append(name)
                out.update(tree(child, (*path, name)))
        elif action.option_strings:
            names = [o for o in action.option_strings if o.startswith("--")] or action.option_strings
            words += names
            if action.nargs != 0 and not isinstance(action, argparse._VersionAction | argparse._HelpAction):
                values += names
        elif action.choices:
            words += [str(c) for c in action.choices]
        else:
            files = True
    out[path] = Node(sorted(set(words)), files, sorted(set(values)))
    return out


def _cases(t: dict[tuple[str, ...], Node], indent: str) -> tuple[str, str]:
    """The two `case` bodies: which (path, word) steps into a subcommand, and what completes per path."""
    steps = sorted(f'"{"/".join(p[:-1])}/{p[-1]}"' for p in t if p)
    step = f"{indent}{'|'.join(steps)}) cmd=\"${{cmd:+$cmd/}}$w\" ;;\n" if steps else ""
    per_path = "".join(
        f'{indent}"{"/".join(p)}") opts={shlex.quote(" ".join(n.words))} files={int(n.files)}'
        f' values={shlex.quote(" ".join(n.takes_value))} ;;\n'
        for p, n in sorted(t.items())
    )
    return step, per_path


def bash_script(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    fn = "_" + prog.replace("-", "_")
    step, per_path = _cases(tree(parser), "        ")
    return f"""# bash completion for {prog}; made by `{prog} completion bash` from its own parser
{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local cmd="" opts="" files=0 values="" w i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        case "$cmd/$w" in
{step}        esac
    done
    case "$cmd" in
{per_path}    esac
    if [[ -n "$prev" && " $values " == *" $prev "* ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
        return
    fi
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    if [[ $files == 1 && "$cur" != -* ]]; then
        COMPREPLY+=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F {fn} {prog}
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    fn = "_" + prog.replace("-", "_")
    step, per_path = _cases(tree(parser), "    ")
    return f"""#compdef {prog}
# zsh completion for {prog}; made by `{prog} completion zsh` from its own parser
{fn}() {{
  local cmd="" opts="" files=0 values="" w i
  local prev="${{words[CURRENT-1]}}"
  for ((i = 2; i < CURRENT; i++)); do
    w="${{words[i]}}"
    case "$cmd/$w" in
{step}    esac
  done
  case "$cmd" in
{per_path}  esac
  if [[ -n "$prev" && " $values " == *" $prev "* ]]; then
    _files
    return
  fi
  compadd -- ${{=opts}}
  if [[ $files == 1 && "${{words[CURRENT]}}" != -* ]]; then
    _files
  fi
}}
if [[ "${{zsh_eval_context[-1]}}" == loadautofunc ]]; then
  {fn} "$@"
else
  compdef {fn} {prog}
fi
"""


def cmd_completion(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(bash_script(parser) if args.shell == "bash" else zsh_script(parser))
    return 0
