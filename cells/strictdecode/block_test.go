package strictdecode

import (
	"encoding/json"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"
)

var blockSeeds = []string{
	"apiVersion: networking.k8s.aws/v1alpha1\nkind: PolicyEndpoint\nmetadata:\n  name: a\n  namespace: b\nspec:\n  podIsolation:\n  - Egress\n  egress:\n  - cidr: 10.0.0.0/8\n    except:\n    - 10.1.0.0/16\n    ports:\n    - protocol: TCP\n      port: 80\n      endPort: 90\n  - cidr: \"::/0\"\n    except:\n    - \"fe80::/10\"\n",
	"a:\n  - x\n  - y\nb: 1\nc:\nd: fe80::/10\n",
	"spec:\n  ipam:\n    pool:\n      10.0.1.5:\n        resource: eni-1\n",
	"a: yes\n", "a: y\n", "a: 012\n", "a: 0x12\n", "a: 1e3\n", "a: 1.5\n", "a: 12:30\n", "a: 1:2:3\n",
	"a: b: c\n", "a: 1\na: 2\n", "a: foo\n  bar\n", "- a\n- b\n", "a:\n-\n", "a: ~\n", "a: \"x\"y\"\n",
	"1: x\n", "true: x\n", "a.b/c: d\n", "a:\n b: 1\n c:\n - d\n - e: f\n   g: h\n",
	"# head\na:\n  # inside\n  b: true\n  c: false\n# between\nd: []\ne: {}\nf: 1m30s\ng: 0/0\n", "a: True\n", "a: [ ]\n",
	"a:\n- []\n- {}\n", "a: b []\n", "a: 1.5h\n", "a: \"#x\"\n", "a:\n  - b\n  # c\n  - d\n", "a: b\n  # c\n  d\n",
}

func TestBlockToJSONMatchesTheLibrary(t *testing.T) {
	for _, s := range blockSeeds {
		checkBlock(t, []byte(s))
	}
	js, ok := blockToJSON([]byte(blockSeeds[0]))
	if !ok {
		t.Fatalf("the kubectl-style document is not read by the block reader")
	}
	if !json.Valid(js) {
		t.Fatalf("%s: not JSON", js)
	}
}

func FuzzBlockToJSON(f *testing.F) {
	for _, s := range blockSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkBlock)
}

// checkBlock: what the block reader reads, the library reads the same.
func checkBlock(t *testing.T, data []byte) {
	js, ok := blockToJSON(data)
	if !ok {
		return
	}
	want, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatalf("%q: the block reader read %s, the library refuses it: %v", data, js, err)
	}
	var got, exp any
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatalf("%q: the block reader wrote %s: %v", data, js, err)
	}
	json.Unmarshal(want, &exp)
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("%q: block reader %s, library %s", data, js, want)
	}
}
