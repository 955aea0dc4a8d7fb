// gitopsdiff runs Argo CD's own diff code (the gitops-engine pkg/diff package, at the
// version Argo CD v3.2.12 builds with) against a live object on a real API server, and
// applies manifests the way an Argo CD sync does (gitops-engine's kubectl apply path).
// The e2e tests (e2e/test_gitops_drift.py) drive it; it is not shipped.
//
//	gitopsdiff apply --kubeconfig K --manifest F [--server-side] [--manager argocd-controller]
//	gitopsdiff diff  --kubeconfig K --manifest F [--manager argocd-controller]
//
// diff prints one JSON object: {"engine": version, "modes": {mode: {...}}} with, for each
// mode, "modified" (what Argo CD shows as OutOfSync), "predictedLive" and "normalizedLive"
// (the two sides Argo CD compares, as JSON), or "error". Modes:
//
//	legacy                  diff.Diff with default options (three-way on the
//	                        last-applied-configuration annotation, else two-way)
//	structured-merge        diff.Diff WithStructuredMergeDiff (what Argo CD uses for
//	                        ServerSideApply=true applications)
//	server-side             diff.Diff WithServerSideDiff (dry-run server-side apply;
//	                        mutating-webhook changes removed, Argo CD's default)
//	server-side+mutation    the same WithIgnoreMutationWebhook(false)
//	                        (compare-options IncludeMutationWebhook=true)
//
// With --ignore FILE (Application fragments as `envelope gitops-config --argocd` prints
// them: YAML documents with spec.ignoreDifferences), every mode is run a second time,
// as "<mode>+ignore", with Argo CD's own ignoreDifferences normalizer
// (argo-cd/v3 util/argo/normalizers at v3.2.12, the release whose gitops-engine this is).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/argo/normalizers"
	"github.com/argoproj/gitops-engine/pkg/diff"
	"github.com/argoproj/gitops-engine/pkg/utils/kube"
	"github.com/argoproj/gitops-engine/pkg/utils/tracing"
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	cmdutil "k8s.io/kubectl/pkg/cmd/util"
	"sigs.k8s.io/yaml"
)

// EngineVersion is the gitops-engine module version this program is built against
// (set by build-gitopsdiff.sh with -ldflags -X).
var EngineVersion = "unknown"

func main() {
	if len(os.Args) < 2 {
		fail("usage: gitopsdiff apply|diff|version [flags]")
	}
	cmd := os.Args[1]
	if cmd == "version" {
		fmt.Println(EngineVersion)
		return
	}
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file")
	manifest := fs.String("manifest", "", "one YAML or JSON object")
	manager := fs.String("manager", "argocd-controller", "field manager (Argo CD's is argocd-controller)")
	serverSide := fs.Bool("server-side", false, "apply: server-side apply (Argo CD ServerSideApply=true)")
	ignoreFile := fs.String("ignore", "", "diff: also run every mode with these ignoreDifferences")
	_ = fs.Parse(os.Args[2:])
	if *kubeconfig == "" || *manifest == "" {
		fail("--kubeconfig and --manifest are required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	check(err, "kubeconfig")
	raw, err := os.ReadFile(*manifest)
	check(err, "manifest")
	obj := &unstructured.Unstructured{}
	check(yaml.Unmarshal(raw, &obj.Object), "manifest YAML")

	log := logr.Discard()
	kubectl := &kube.KubectlCmd{Log: log, Tracer: tracing.NopTracer{}}
	oapi, gvkParser, err := kubectl.LoadOpenAPISchema(config)
	check(err, "OpenAPI schema")
	ctx := context.Background()

	switch cmd {
	case "apply":
		ops, cleanup, err := kubectl.ManageResources(config, oapi)
		check(err, "resource operations")
		defer cleanup()
		out, err := ops.ApplyResource(ctx, obj, cmdutil.DryRunNone, false, false, *serverSide, *manager)
		check(err, "apply")
		fmt.Print(out)
	case "diff":
		live := getLive(ctx, config, obj)
		applier, cleanup, err := kube.ManageServerSideDiffDryRuns(config, oapi, tracing.NopTracer{}, log, nil)
		check(err, "server-side dry runner")
		defer cleanup()
		runner := diff.NewK8sServerSideDryRunner(applier)
		common := []diff.Option{diff.WithLogr(log), diff.WithGVKParser(gvkParser), diff.WithManager(*manager)}
		modes := map[string][]diff.Option{
			"legacy":           {diff.WithLogr(log)},
			"structured-merge": append(append([]diff.Option{}, common...), diff.WithStructuredMergeDiff(true)),
			"server-side": append(append([]diff.Option{}, common...),
				diff.WithServerSideDiff(true), diff.WithServerSideDryRunner(runner), diff.WithIgnoreMutationWebhook(true)),
			"server-side+mutation": append(append([]diff.Option{}, common...),
				diff.WithServerSideDiff(true), diff.WithServerSideDryRunner(runner), diff.WithIgnoreMutationWebhook(false)),
		}
		if *ignoreFile != "" {
			normalizer := ignoreNormalizer(*ignoreFile)
			for name, opts := range modes {
				if !strings.HasSuffix(name, "+ignore") {
					modes[name+"+ignore"] = append(append([]diff.Option{}, opts...), diff.WithNormalizer(normalizer))
				}
			}
		}
		result := map[string]any{}
		for name, opts := range modes {
			r, err := diff.Diff(obj.DeepCopy(), live.DeepCopy(), opts...)
			if err != nil {
				result[name] = map[string]any{"error": err.Error()}
				continue
			}
			result[name] = map[string]any{
				"modified":       r.Modified,
				"predictedLive":  json.RawMessage(orNull(r.PredictedLive)),
				"normalizedLive": json.RawMessage(orNull(r.NormalizedLive)),
			}
		}
		out, err := json.Marshal(map[string]any{"engine": EngineVersion, "modes": result})
		check(err, "result JSON")
		fmt.Println(string(out))
	default:
		fail("unknown command " + cmd)
	}
}

func getLive(ctx context.Context, config *rest.Config, obj *unstructured.Unstructured) *unstructured.Unstructured {
	disco, err := discovery.NewDiscoveryClientForConfig(config)
	check(err, "discovery")
	dyn, err := dynamic.NewForConfig(config)
	check(err, "dynamic client")
	gvk := obj.GroupVersionKind()
	res, err := kube.ServerResourceForGroupVersionKind(disco, gvk, "get")
	check(err, "resource for "+gvk.String())
	ri := kube.ToResourceInterface(dyn, res, gvk.GroupVersion().WithResource(res.Name), obj.GetNamespace())
	live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	check(err, "get live object")
	return live
}

// ignoreNormalizer is Argo CD's normalizer for the ignoreDifferences of every
// Application fragment in the file.
func ignoreNormalizer(path string) diff.Normalizer {
	raw, err := os.ReadFile(path)
	check(err, "ignore file")
	var ignores []v1alpha1.ResourceIgnoreDifferences
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var app struct {
			Spec struct {
				IgnoreDifferences []v1alpha1.ResourceIgnoreDifferences `json:"ignoreDifferences"`
			} `json:"spec"`
		}
		check(yaml.Unmarshal([]byte(doc), &app), "ignore file YAML")
		ignores = append(ignores, app.Spec.IgnoreDifferences...)
	}
	normalizer, err := normalizers.NewIgnoreNormalizer(ignores, nil, normalizers.IgnoreNormalizerOpts{})
	check(err, "ignoreDifferences")
	return normalizer
}

func orNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

func check(err error, what string) {
	if err != nil {
		fail(what + ": " + err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "gitopsdiff: "+msg)
	os.Exit(2)
}
