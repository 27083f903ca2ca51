// Example PAC for the egress mediator ([upstream] mode = "pac"; docs/routing.md). The
// mediator calls it only for connections its grants already allowed and whose addresses it
// already vetted; the answer only chooses how to get there.
//
// The mediator hands over "https://host[:port]/" for tunnels (CONNECT, SOCKS5) and
// "http://host[:port]/" for plain HTTP: never a path or query. Every parent named here
// must be listed in [upstream] allowed_parents ("host:port"), or the entry is skipped.
// dnsResolve/isInNet/isResolvable use the mediator's own resolver.

function FindProxyForURL(url, host) {
    // Intranet names: straight there.
    if (isPlainHostName(host) ||
        dnsDomainIs(host, ".corp.example") ||
        localHostOrDomainIs(host, "wiki.corp.example"))
        return "DIRECT";

    // Addresses inside the corporate network (resolved with the mediator's resolver).
    var ip = dnsResolve(host);
    if (ip != null && (isInNet(ip, "10.0.0.0", "255.0.0.0") ||
                       isInNet(ip, "172.16.0.0", "255.240.0.0")))
        return "DIRECT";

    // Package registries through the fast proxy, the general one as fallback.
    if (shExpMatch(host, "*.npmjs.org") || shExpMatch(host, "*.pythonhosted.org") ||
        host == "pypi.org" || host == "crates.io" || shExpMatch(host, "*.crates.io"))
        return "PROXY proxy-fast.corp.example:3128; PROXY proxy.corp.example:8080";

    // Everything else through the main proxy; a SOCKS5 gateway if it is down.
    return "PROXY proxy.corp.example:8080; SOCKS5 socks.corp.example:1080";
}
