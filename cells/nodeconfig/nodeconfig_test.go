package nodeconfig

import (
	"strings"
	"testing"
)

func TestIPMasqAgentValidateNamesTheMissingFlag(t *testing.T) {
	agent := IPMasqAgent{Enabled: true, ConfigPath: DefaultIPMasqAgentConfigPath}
	for _, tc := range []struct {
		name  string
		agent IPMasqAgent
		masq  Masquerade
		want  string // "" = valid
	}{
		{"disabled", IPMasqAgent{}, Masquerade{}, ""},
		{"without BPF masquerade", agent, Masquerade{IPv4: true, IPv6: true}, "--enable-bpf-masquerade"},
		{"without family masquerade", agent, Masquerade{BPF: true}, "--enable-ipv4-masquerade or --enable-ipv6-masquerade"},
		{"IPv6 only", agent, Masquerade{BPF: true, IPv6: true}, ""},
		{"no path", IPMasqAgent{Enabled: true}, Masquerade{BPF: true, IPv4: true}, "--ip-masq-agent-config-path"},
	} {
		err := tc.agent.Validate(tc.masq)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}

func TestMasqueradePerFamily(t *testing.T) {
	m := Masquerade{BPF: true, IPv4: true}
	if !m.V4() || m.V6() {
		t.Errorf("%+v: V4 %t V6 %t", m, m.V4(), m.V6())
	}
	m.BPF = false
	if m.V4() {
		t.Errorf("%+v: V4 without BPF masquerade", m)
	}
}
