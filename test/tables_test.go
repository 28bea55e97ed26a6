package test

// The tables and health modules every agent has; feature issues add theirs.
var (
	agentTables  = []string{}
	agentModules = []string{"node", "shell", "api"}
)
