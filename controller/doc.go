// Package controller is Narwhal's role controller (docs/role-control.md): it decides when an
// engine moves between the prefill and decode roles, and proves each move against the rules.
//
// The core is Controller, deterministic and clock-free: Tick takes the time, a fleet snapshot
// and the router's projection (View), runs the evaluation due — floor repair and readmission,
// an urgent evaluation the router triggered, or a regular pass — prices candidate splits with
// the router's own projection, applies every gate (pins, health, dwell, cooldown, coverage,
// confirmations, the arrival-evidence window, the decode donor's residents), and proposes one
// decision record (decisionlog.Decision). The caller applies what it can of the decision's moves to the fleet
// (ApplyDecision; NotApplied when it cannot persist them) and acknowledges it (Applied): only a
// move made counts for the guards. Durable and Restore carry the guard state across restarts.
//
// Live runs a Controller in real time beside router.Live: it sleeps until NextDeadline or an
// urgent trigger, prices a fork of the router taken under its lock, persists, applies, logs and
// publishes each decision to the decision log (decisionlog.Log), which package audit checks
// without this package's code.
//
// The package holds three cores, each with the loop that runs it in real time (the simulator
// runs the cores in virtual time):
//
//	job                          core (time in, actions out)        loop (real time, I/O)
//	role control                 Controller     controller.go      Live      live.go
//	health and lifecycles        Health         health.go          Monitor   monitor.go
//	in-place role switches       SwitchSteps    switch.go          Switcher  switch.go
//
// The loops meet only through the fleet (package fleet) and the router; the engine-facing
// clients they call (the HTTP probe, the SGLang switch) are package engineclient.
package controller
