package main

import (
	upstream "github.com/cilium/hive"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/enimasq/enimasq"
)

// notInCiliumBuild are enimasq's flags that do nothing in this build:
// Cilium's programs own the pods' devices, so enimasq attaches no policy
// program (Documentation/cilium.md, "Network policy"), and how or in which
// mode it would attach one, or what its programs would report, means
// nothing here.
var notInCiliumBuild = map[string]bool{
	"network-policy-attach":                true,
	"network-policy-attach-check-interval": true,
	"network-policy-enforcing-mode":        true,
	"policy-conntrack-max":                 true,
	"policy-event-logs":                    true,
}

// enimasqFlags are the names of the flags enimasq's feature cells declare.
func enimasqFlags() map[string]bool {
	own := pflag.NewFlagSet("enimasq", pflag.ContinueOnError)
	upstream.New(enimasq.Features).RegisterFlags(own)
	names := map[string]bool{}
	own.VisitAll(func(f *pflag.Flag) { names[f.Name] = true })
	return names
}

// markEnimasqFlags makes enimasq's flags tell themselves apart from
// Cilium's in cilium-agent's help ("(enimasq) ..."), and takes those of
// notInCiliumBuild off the command line: cobra's flag set is made again
// without them (an unknown flag then, as any other). The hive keeps them
// with their defaults: its viper bound every flag when the hive was built,
// so that enimasq's config cells still decode.
func markEnimasqFlags(root *cobra.Command) {
	own := enimasqFlags()
	var keep []*pflag.Flag
	root.Flags().VisitAll(func(f *pflag.Flag) {
		if own[f.Name] {
			f.Usage = "(enimasq) " + f.Usage
		}
		if !notInCiliumBuild[f.Name] {
			keep = append(keep, f)
		}
	})
	persistent := root.PersistentFlags()
	root.ResetFlags()
	for _, f := range keep {
		root.Flags().AddFlag(f)
	}
	root.PersistentFlags().AddFlagSet(persistent)
}
