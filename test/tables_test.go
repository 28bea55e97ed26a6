package test

// The tables and health modules of every agent.
var (
	agentTables  = []string{"ip-masq-agent-cidrs", "masq-map-entries", "enis", "ipam-allocations", "eni-rules", "eni-routes", "policy-endpoints", "policy-map-entries", "policy-attachments", "policy-bindings"}
	agentModules = []string{"node", "shell", "api", "ipmasq", "policymap", "ipam"}
)
