"""Checks of the local rendezvous: the hostname resolves, the port is free."""

from __future__ import annotations

from xtrain.machine.facts import Facts
from xtrain.planning.plan import Finding, Plan
from xtrain.shell import comment, set_env

# gloo binds its transport to the address the hostname resolves to, unless GLOO_SOCKET_IFNAME
# names an interface (FIELD_NOTES, turn 2). On one machine the fix is to pin gloo to loopback,
# not to rename the host. Linux calls the loopback "lo", macOS "lo0". Windows: torch's gloo uses
# the libuv transport there (GlooDeviceFactory.cpp registers makeUVDevice for WIN32), which
# matches GLOO_SOCKET_IFNAME with strcmp against uv_interface_addresses() names; libuv on
# Windows takes those from the adapter's FriendlyName (src/win/util.c), i.e. PowerShell's
# InterfaceAlias, "Loopback Pseudo-Interface 1" on an English install (loopback adapters are
# listed, with 127.0.0.1 and ::1). Not run on Windows here, and the alias may differ by
# language, so the fix asks Windows for the alias of 127.0.0.1 instead of spelling it out. The
# rendezvous itself never uses the hostname in xtrain's single-machine plans (a file store for
# spawn, 127.0.0.1 for accelerate's launcher).
LOOPBACK_IFNAME = {"linux": "lo", "wsl2": "lo", "macos": "lo0"}
WINDOWS_LOOPBACK_ALIAS = "(Get-NetIPAddress -IPAddress 127.0.0.1).InterfaceAlias"


def _gloo_loopback_fix(plan: Plan) -> str:
    if plan.shell == "powershell":
        return "\n".join(
            [
                comment(
                    "pin gloo to the loopback adapter (its Windows alias, e.g. Loopback Pseudo-Interface 1):"
                ),
                f"$env:GLOO_SOCKET_IFNAME = {WINDOWS_LOOPBACK_ALIAS}",
            ]
        )
    return set_env(plan.shell, "GLOO_SOCKET_IFNAME", LOOPBACK_IFNAME.get(plan.os_kind, "lo"))


def _hosts_entry_fix(facts: Facts, plan: Plan) -> str:
    """Several machines: the name must resolve to this machine's LAN address on every peer."""
    if plan.shell == "powershell":
        ip = (
            "(Get-NetIPConfiguration | Where-Object IPv4DefaultGateway | Select-Object -First 1)"
            ".IPv4Address[0].IPAddress"
        )
        return "\n".join(
            [
                comment("as Administrator: map this PC's name to its LAN address"),
                'Add-Content -Path "$env:SystemRoot\\System32\\drivers\\etc\\hosts" '
                f'-Value "$({ip}) $env:COMPUTERNAME"',
            ]
        )
    return 'echo "$(hostname -I | cut -d" " -f1) $(hostname)" | sudo tee -a /etc/hosts'


def check_hostname(facts: Facts, plan: Plan) -> list[Finding]:
    pinned = "GLOO_SOCKET_IFNAME" in facts.launch_env  # gloo then never looks at the hostname
    one_machine = plan.num_machines == 1
    if not facts.hostname.strip():
        if pinned and one_machine:
            return []
        if one_machine:
            fix = _gloo_loopback_fix(plan)
        elif plan.shell == "powershell":
            fix = "\n".join([comment("as Administrator, then reboot:"), "Rename-Computer -NewName xtrain-pc"])
        else:
            fix = "sudo hostnamectl set-hostname xtrain-pc"
        return [
            Finding(
                "hostname-empty",
                "error",
                'The hostname is empty: gloo fails with "makeUVDevice(): interface or hostname '
                "can't be empty\" unless GLOO_SOCKET_IFNAME names an interface.",
                fix,
            )
        ]
    if facts.hostname_resolves is False and not (pinned and one_machine):
        return [
            Finding(
                "hostname-unresolvable",
                "warn" if one_machine else "error",
                f"The hostname {facts.hostname!r} does not resolve: gloo binds to the hostname's "
                "address, and torchelastic publishes the name to its peers"
                + (
                    " (on one machine, pin gloo to loopback with GLOO_SOCKET_IFNAME; xtrain's "
                    "rendezvous never uses the hostname)."
                    if one_machine
                    else "."
                ),
                _gloo_loopback_fix(plan) if one_machine else _hosts_entry_fix(facts, plan),
            )
        ]
    return []


def check_port(facts: Facts, plan: Plan) -> list[Finding]:
    if facts.port_free is False and plan.main_port == facts.port:
        return [
            Finding(
                "port-busy",
                "warn" if plan.world_size > 1 else "ok",
                f"Port {facts.port} (the default rendezvous port) is in use: another training may be "
                "running.",
                "\n".join(
                    [
                        f"xtrain configure --port {facts.port + 1} --force",
                        comment(f"or stop the other job that holds port {facts.port}"),
                    ]
                ),
            )
        ]
    return []
