// Command kubecheck checks Kubernetes manifests (the YAML documents `helm template`
// prints, on stdin) against Kubernetes' own API types as client-go knows them: strict
// decoding (no unknown or duplicated field, every value of its type) and the structured
// schema that server-side apply validates with. A kind client-go does not know (a custom
// resource's, such as KEDA's ScaledObject) is listed as skipped. It prints one line per
// document and exits 1 when one is invalid.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/applyconfigurations"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

func main() {
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	converter := applyconfigurations.NewTypeConverter(scheme.Scheme)
	reader := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	invalid := 0
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kubecheck: cannot read the input: %v\n", err)
			os.Exit(2)
		}
		var head header
		if err := yaml.Unmarshal(doc, &head); err != nil {
			fmt.Printf("invalid document: %v\n", err)
			invalid++
			continue
		}
		if head.Kind == "" {
			continue // only comments
		}
		what := fmt.Sprintf("%s %s (%s)", head.Kind, head.Metadata.Name, head.APIVersion)
		gvk := schema.FromAPIVersionAndKind(head.APIVersion, head.Kind)
		if !scheme.Scheme.Recognizes(gvk) {
			fmt.Printf("skipped %s: not a built-in kind\n", what)
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err == nil {
			_, err = converter.ObjectToTyped(obj)
		}
		if err != nil {
			fmt.Printf("invalid %s: %v\n", what, err)
			invalid++
			continue
		}
		fmt.Printf("ok %s\n", what)
	}
	if invalid > 0 {
		os.Exit(1)
	}
}
