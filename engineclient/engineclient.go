// Package engineclient is Narwhal as a client of its engines (an edge: network I/O only): the
// HTTP health probe, the resolution of an engine's host name, SGLang's in-place role switch
// (POST /pd_role_switch), and the reading of their metrics (metrics.go, reader.go). The cores
// that use them own the interfaces they implement (controller.Prober, controller.RoleSwitcher,
// the router's observations through Observer).
package engineclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// HTTPProber probes GET http://IP:port<Path> and wants a 2xx answer.
type HTTPProber struct {
	Client   *http.Client
	Path     string
	Resolver *net.Resolver // nil: net.DefaultResolver
	// Targets are the engines whose probe goes elsewhere than Path on their own port
	// (engines[].health), by configured address.
	Targets map[string]config.EngineHealth
}

// Probe implements controller.Prober.
func (p *HTTPProber) Probe(ctx context.Context, address string) (netip.AddrPort, error) {
	ap, err := Resolve(ctx, p.Resolver, address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	target, path := ap, p.Path
	if t, ok := p.Targets[address]; ok {
		if t.Port != 0 {
			target = netip.AddrPortFrom(ap.Addr(), uint16(t.Port))
		}
		if t.Path != "" {
			path = t.Path
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+target.String()+path, nil)
	if err != nil {
		return ap, err
	}
	resp, err := p.Client.Do(req)
	if err != nil {
		return ap, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return ap, fmt.Errorf("health: %s%s answered %s", target, path, resp.Status)
	}
	return ap, nil
}

// Resolve turns host:port into IP:port, looking the host up when it is a name (the first
// address the resolver returns, IPv4 preferred).
func Resolve(ctx context.Context, r *net.Resolver, address string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(address); err == nil {
		return ap, nil
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	pn, err := net.LookupPort("tcp", port)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if r == nil {
		r = net.DefaultResolver
	}
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(ips) == 0 {
		return netip.AddrPort{}, fmt.Errorf("resolve %s: no addresses", host)
	}
	best := ips[0]
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			best = ip
			break
		}
	}
	return netip.AddrPortFrom(best.Unmap(), uint16(pn)), nil
}

// ResolveFleet resolves every engine's host name once, each within timeout, and records the
// address in the fleet; serve runs it before serving (the health monitor re-resolves on every
// pass). An engine that does not resolve is logged and takes no placements until it does.
func ResolveFleet(ctx context.Context, f *fleet.Fleet, timeout time.Duration, log *slog.Logger) {
	for _, e := range f.Snapshot().Engines {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		ap, err := Resolve(rctx, nil, e.Address)
		cancel()
		if err != nil {
			log.Warn("engine address does not resolve", "engine", e.ID, "address", e.Address, "err", err)
			continue
		}
		_, _ = f.SetAddr(e.ID, ap, time.Now())
	}
}

// SGLangSwitch switches SGLang engines (server flag --enable-pd-role-switch): POST
// /pd_role_switch {"new_role": "prefill"|"decode"}, answered {"success", "message",
// "old_role", "new_role"}. A refusal (the engine is not idle, a switch is in progress) or a
// failed rebuild is an error carrying the engine's message.
type SGLangSwitch struct {
	Client *http.Client
}

// Switch asks the engine at addr (host:port) to take role to.
func (c SGLangSwitch) Switch(ctx context.Context, addr string, to fleet.Role) (string, error) {
	body, _ := json.Marshal(map[string]string{"new_role": to.String()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/pd_role_switch", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	hc := c.Client
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("POST /pd_role_switch: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var ans struct {
		Success *bool  `json:"success"`
		Message string `json:"message"`
		OldRole string `json:"old_role"`
		NewRole string `json:"new_role"`
	}
	if err := json.Unmarshal(raw, &ans); err != nil || ans.Success == nil {
		return "", fmt.Errorf("POST /pd_role_switch answered %s: %s", resp.Status, strings.TrimSpace(string(raw)))
	}
	switch {
	case !*ans.Success:
		return "", fmt.Errorf("POST /pd_role_switch refused (%s): %s", resp.Status, ans.Message)
	case resp.StatusCode/100 != 2:
		return "", fmt.Errorf("POST /pd_role_switch answered %s: %s", resp.Status, ans.Message)
	case ans.NewRole != "" && ans.NewRole != to.String():
		return "", fmt.Errorf("POST /pd_role_switch: the engine says it is now %s, not %s", ans.NewRole, to)
	}
	return fmt.Sprintf("%s -> %s: %s", ans.OldRole, ans.NewRole, ans.Message), nil
}
