{{/* Chart name, truncated to 63 characters. */}}
{{- define "envelope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the prefix of every object name. */}}
{{- define "envelope.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "envelope.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "envelope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "envelope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "envelope.labels" -}}
helm.sh/chart: {{ include "envelope.chart" . }}
{{ include "envelope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: admission-webhook
app.kubernetes.io/part-of: envelope
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "envelope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "envelope.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "envelope.configMapName" -}}
{{- printf "%s-config" (include "envelope.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The two webhook configurations share the full name (they are different kinds). */}}
{{- define "envelope.webhookConfigurationName" -}}
{{- include "envelope.fullname" . -}}
{{- end -}}

{{/* Secret the pods serve from: made by the webhook (self), by cert-manager, or by you. */}}
{{- define "envelope.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "provided" -}}
{{- required "certificates.provided.secretName is required when certificates.mode=provided" .Values.certificates.provided.secretName -}}
{{- else -}}
{{- default (printf "%s-tls" (include "envelope.fullname" .)) .Values.certificates.secretName -}}
{{- end -}}
{{- end -}}

{{- define "envelope.leaseName" -}}
{{- default (printf "%s-leader" (include "envelope.fullname" .)) .Values.certificates.self.leaseName -}}
{{- end -}}

{{/* The Lease the namespace fact keeper renews and the in-tree binding reads
(app/cli/serve.py: --lease-name plus -facts). */}}
{{- define "envelope.factLeaseName" -}}
{{- printf "%s-facts" (include "envelope.leaseName" .) -}}
{{- end -}}

{{- define "envelope.certManagerCertificateName" -}}
{{- printf "%s-serving" (include "envelope.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The image; one with no registry or namespace (a bare name such as the default
`envelope`) would be pulled from docker.io/library, where no Envelope image is
published, and end in ImagePullBackOff: refused unless image.local says the image is
loaded into the nodes (kind load docker-image, minikube image load). */}}
{{- define "envelope.image" -}}
{{- if and (not (contains "/" .Values.image.repository)) (not .Values.image.local) -}}
{{- fail (printf "image.repository %q names no registry: the nodes would pull docker.io/library/%s, where no Envelope image is published. Build and push the image (make image IMAGE=REGISTRY/envelope:%s, then push it) and set image.repository=REGISTRY/envelope, or set image.local=true on a cluster whose nodes already hold the image (kind load docker-image %s:%s)" .Values.image.repository .Values.image.repository (default .Chart.AppVersion .Values.image.tag) .Values.image.repository (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Service DNS names the serving certificate must carry. */}}
{{- define "envelope.serviceDNSNames" -}}
{{- $svc := include "envelope.fullname" . -}}
{{- $ns := .Release.Namespace -}}
- {{ $svc }}
- {{ $svc }}.{{ $ns }}
- {{ $svc }}.{{ $ns }}.svc
- {{ $svc }}.{{ $ns }}.svc.cluster.local
{{- end -}}

{{/*
Resources of our own container: no CPU limit, memory request == memory limit.
limits.memory is copied into requests.memory (or the other way when only the request is
set); a CPU limit or two different memory values fail the render.
*/}}
{{- define "envelope.resources" -}}
{{- $requests := deepCopy (default (dict) .Values.resources.requests) -}}
{{- $limits := deepCopy (default (dict) .Values.resources.limits) -}}
{{- if hasKey $limits "cpu" -}}
{{- fail "resources.limits.cpu must not be set: Envelope's own container follows its own rule (CPU requests only, no CPU limits)" -}}
{{- end -}}
{{- $reqMem := toString (default "" (get $requests "memory")) -}}
{{- $limMem := toString (default "" (get $limits "memory")) -}}
{{- if and $reqMem $limMem (ne $reqMem $limMem) -}}
{{- fail (printf "resources: memory request (%s) must equal the memory limit (%s): set resources.limits.memory only (the request follows it), or write both the same way" $reqMem $limMem) -}}
{{- end -}}
{{- $mem := default $limMem $reqMem -}}
{{- if not $mem -}}
{{- fail "resources: set resources.limits.memory (the memory request is set equal to it)" -}}
{{- end -}}
{{- $_ := set $requests "memory" $mem -}}
{{- $_ := set $limits "memory" $mem -}}
requests:
  {{- toYaml $requests | nindent 2 }}
limits:
  {{- toYaml $limits | nindent 2 }}
{{- end -}}

{{/*
namespaceSelector for the namespaced webhooks: never kube-system, never our own
namespace (so Envelope can always be repaired), never the user's extra list.
Selects on kubernetes.io/metadata.name, which the API server sets and nobody can change.
*/}}
{{- define "envelope.namespaceSelector" -}}
{{- $excluded := concat (list "kube-system" .Release.Namespace) .Values.webhooks.excludeNamespaces | uniq -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- toYaml $excluded | nindent 6 }}
{{- with .Values.webhooks.namespaceSelectorExpressions }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
clientConfig for one webhook. Args: dict "root" $ "path" "/mutate" "kind" KIND "webhook" NAME.
caBundle:
  provided    -> the value you gave;
  certManager -> none here, cert-manager's cainjector writes it (inject-ca-from annotation);
  self        -> the one already in the cluster (lookup), so `helm upgrade` never blanks
                 what the webhook injected; none on first install / `helm template`.
*/}}
{{- define "envelope.clientConfig" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- if $v.webhooks.url -}}
url: {{ printf "%s%s" (trimSuffix "/" $v.webhooks.url) .path | quote }}
{{- else -}}
service:
  name: {{ include "envelope.fullname" $root }}
  namespace: {{ $root.Release.Namespace }}
  path: {{ .path }}
  port: {{ $v.service.port }}
{{- end }}
{{- if eq $v.certificates.mode "provided" }}
caBundle: {{ required "certificates.provided.caBundle is required when certificates.mode=provided" $v.certificates.provided.caBundle | quote }}
{{- else if eq $v.certificates.mode "self" }}
{{- $ca := include "envelope.existingCaBundle" (dict "root" $root "kind" .kind "webhook" .webhook) }}
{{- if $ca }}
caBundle: {{ $ca | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The caBundle the cluster already has for this webhook: the same entry of the same
configuration first, then any entry of either configuration (they share one CA), then
the trust bundle (ca-bundle.crt, else ca.crt) of the webhook's own Secret. Empty when nothing exists (first install, or
`helm template`, where lookup returns nothing).
*/}}
{{- define "envelope.existingCaBundle" -}}
{{- $root := .root -}}
{{- $name := include "envelope.webhookConfigurationName" $root -}}
{{- $found := "" -}}
{{- $same := lookup "admissionregistration.k8s.io/v1" .kind "" $name -}}
{{- range (default (list) (dig "webhooks" (list) $same)) -}}
{{- if and (not $found) (eq .name $.webhook) -}}
{{- $found = dig "clientConfig" "caBundle" "" . -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- range $kind := list "MutatingWebhookConfiguration" "ValidatingWebhookConfiguration" -}}
{{- $cfg := lookup "admissionregistration.k8s.io/v1" $kind "" $name -}}
{{- range (default (list) (dig "webhooks" (list) $cfg)) -}}
{{- if not $found -}}
{{- $found = dig "clientConfig" "caBundle" "" . -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- $secret := lookup "v1" "Secret" $root.Release.Namespace (include "envelope.tlsSecretName" $root) -}}
{{- $found = dig "data" "ca-bundle.crt" (dig "data" "ca.crt" "" $secret) $secret -}}
{{- end -}}
{{- $found -}}
{{- end -}}

{{/* certManager mode: cert-manager's cainjector writes caBundle from the Certificate. */}}
{{- define "envelope.webhookAnnotations" -}}
{{- if eq .Values.certificates.mode "certManager" }}
cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "envelope.certManagerCertificateName" .) }}
{{- end }}
{{- if .Values.webhooks.safeInstall }}
{{- $w := .Values.webhooks }}
{{- $wanted := dict "workloads.mutate.envelope.io" $w.workloads.mutate.failurePolicy "workloads.validate.envelope.io" $w.workloads.validate.failurePolicy "quotas.validate.envelope.io" $w.quotas.failurePolicy "actors.validate.envelope.io" $w.actors.failurePolicy }}
{{- if .Values.exceptions.enabled }}
{{- $_ := set $wanted "exceptions.validate.envelope.io" .Values.exceptions.failurePolicy }}
{{- end }}
{{- /* the validating webhook's partition for a Warn in-tree policy (templates/webhooks.yaml) */}}
{{- if (include "envelope.inTree" .) }}
{{- range (.Files.Get "files/intree.yaml" | fromYaml).validatingPartition }}
{{- $_ := set $wanted (printf "workloads%s.validate.envelope.io" .suffix) $w.workloads.validate.failurePolicy }}
{{- end }}
{{- end }}
envelope.io/failure-policies: {{ $wanted | toJson | quote }}
{{- end }}
{{- end -}}

{{/* The failurePolicy to render: with webhooks.safeInstall every webhook starts as
Ignore, and a ready replica raises it to the wanted one (app/serve/failurepolicy.py). */}}
{{- define "envelope.failurePolicy" -}}
{{- if .root.Values.webhooks.safeInstall -}}Ignore{{- else -}}{{ .want }}{{- end -}}
{{- end -}}

{{/* Settings every webhook entry shares. */}}
{{- define "envelope.webhookCommon" -}}
admissionReviewVersions: ["v1"]
sideEffects: None
matchPolicy: {{ .Values.webhooks.matchPolicy }}
timeoutSeconds: {{ .Values.webhooks.timeoutSeconds }}
{{- end -}}

{{/*
The workloads' mutating webhook's matchConditions: the CEL expression that
app/chart/matchconditions.py generates for .Values.policy (`envelope webhook-config` prints
it; tests/chart/test_matchconditions.py checks that both say the same, byte for byte). True
when some mutate-phase rule could act on the write; the API server does not call the
webhook otherwise. Default modes: cpu-limits, env-envelope-cpu, memory-limit,
template-opt-outs, memory-below-limit (which acts only with policy.memoryBelowLimit) enforce;
the two namespace guards warn; `defaultMode: off` turns the unlisted ones off (`warn`
keeps them running, so it changes nothing here).
*/}}
{{- define "envelope.mutateMatchExpression" -}}
{{- $p := .Values.policy -}}
{{- $rules := $p.rules | default dict -}}
{{- $defaults := dict "cpu-limits" "enforce" "env-envelope-cpu" "enforce" "memory-limit" "enforce" "quota-needs-cpu-limits" "warn" "limitrange-needs-cpu-limits" "warn" "template-opt-outs" "enforce" "memory-below-limit" "enforce" -}}
{{- $on := dict -}}
{{- range $id, $mode := $defaults -}}
{{- $m := $mode -}}
{{- if eq (toString $p.defaultMode) "off" -}}{{- $m = "off" -}}{{- end -}}
{{- if ne (toString (index $rules $id | default $m)) "off" -}}{{- $_ := set $on $id true -}}{{- end -}}
{{- end -}}
{{- $all := "((has(s.initContainers) ? s.initContainers : []) + (has(s.containers) ? s.containers : []))" -}}
{{- $cpu := printf "(%s.exists(c, has(c.resources) && has(c.resources.limits) && \"cpu\" in c.resources.limits) || (has(s.resources) && has(s.resources.limits) && \"cpu\" in s.resources.limits))" $all -}}
{{- $key := toJson $p.optOutAnnotation -}}
{{- $ann := "(has(%s) && has(%s.annotations) && %s in %s.annotations && %s.annotations[%s].matches(r'^\\s*(?i:true)\\s*$'))" -}}
{{- $optedOut := printf "!(%s || %s)" (printf $ann "object.metadata" "object.metadata" $key "object.metadata" "object.metadata" $key) (printf $ann "t.metadata" "t.metadata" $key "t.metadata" "t.metadata" $key) -}}
{{- $clauses := list -}}
{{- if or (hasKey $on "quota-needs-cpu-limits") (hasKey $on "limitrange-needs-cpu-limits") -}}
{{- $clauses = append $clauses $cpu -}}
{{- else if hasKey $on "cpu-limits" -}}
{{- $clauses = append $clauses (printf "(%s && %s)" $cpu $optedOut) -}}
{{- end -}}
{{- if hasKey $on "env-envelope-cpu" -}}
{{- $env := printf "%s.exists(c, has(c.env) && c.env.exists(e, e.name == %s && has(e.value) && e.value.matches('(?i)cpu')))" $all (toJson $p.envelopeEnv.limits) -}}
{{- $clauses = append $clauses (printf "(%s && %s)" $env $optedOut) -}}
{{- end -}}
{{- if hasKey $on "memory-limit" -}}
{{- $mem := "(has(%s.requests) && \"memory\" in %s.requests && !(has(%s.limits) && \"memory\" in %s.limits))" -}}
{{- $clauses = append $clauses (printf "(%s.exists(c, has(c.resources) && %s) || (has(s.resources) && %s))" $all (printf $mem "c.resources" "c.resources" "c.resources" "c.resources") (printf $mem "s.resources" "s.resources" "s.resources" "s.resources")) -}}
{{- end -}}
{{- if and (hasKey $on "memory-below-limit") $p.memoryBelowLimit -}}
{{- $apart := "(has(%s.limits) && \"memory\" in %s.limits && !(has(%s.requests) && \"memory\" in %s.requests && %s.requests[\"memory\"] == %s.limits[\"memory\"]))" -}}
{{- $clauses = append $clauses (printf "(%s.exists(c, has(c.resources) && %s) || (has(s.resources) && %s))" $all (printf $apart "c.resources" "c.resources" "c.resources" "c.resources" "c.resources" "c.resources") (printf $apart "s.resources" "s.resources" "s.resources" "s.resources" "s.resources" "s.resources")) -}}
{{- end -}}
{{- $carried := "" -}}
{{- if hasKey $on "template-opt-outs" -}}
{{- $keys := list (printf "%s in object.metadata.annotations" $key) -}}
{{- if $p.allowObjectExemptions -}}{{- $keys = append $keys (printf "%s in object.metadata.annotations" (toJson $p.exemptAnnotation)) -}}{{- end -}}
{{- $carried = printf "object.kind != \"Pod\" && has(object.metadata) && has(object.metadata.annotations) && (%s)" (join " || " $keys) -}}
{{- end -}}
{{- if not $clauses -}}
{{- if $carried -}}{{ $carried }}{{- else -}}false{{- end -}}
{{- else -}}
{{- $roots := "(object.kind == \"Pod\" ? [object] : object.kind == \"CronJob\" ? (has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) && has(object.spec.jobTemplate.spec.template) ? [object.spec.jobTemplate.spec.template] : []) : (has(object.spec) && has(object.spec.template) ? [object.spec.template] : []))" -}}
{{- $found := printf "%s.exists(t, has(t.spec) && [t.spec].exists(s, %s))" $roots (join " || " $clauses) -}}
{{- if $carried -}}{{- printf "(%s) || %s" $carried $found -}}{{- else -}}{{ $found }}{{- end -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the in-tree MutatingAdmissionPolicy is rendered (templates/intree.yaml):
inTree.enabled, the workloads' webhooks on, and an API server that serves
admissionregistration.k8s.io/v1 MutatingAdmissionPolicy; "" otherwise. Fails when
.Values.policy is not the policy files/intree.yaml was compiled from.
*/}}
{{- define "envelope.inTree" -}}
{{- if and .Values.inTree.enabled .Values.webhooks.workloads.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") -}}
{{- $gen := .Files.Get "files/intree.yaml" | fromYaml -}}
{{- if ne (toJson .Values.policy) $gen.policyJson -}}
{{- fail "inTree.enabled: the chart carries the policy compiled for its default `policy` values only; for this policy run `envelope webhook-config --in-tree --config <policy file>`, apply its output, and leave inTree.enabled false" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/*
"true" when the replicas keep the namespace fact the in-tree binding selects on
(`serve --in-tree-facts`, docs/in-tree.md "Guards that read the namespace"): the in-tree
policy is rendered, its binding requires the fact label (the namespace guards are on),
and inTree.namespaceFacts is true; "" otherwise.
*/}}
{{- define "envelope.inTreeFacts" -}}
{{- if and .Values.inTree.namespaceFacts (include "envelope.inTree" .) -}}
{{- $gen := .Files.Get "files/intree.yaml" | fromYaml -}}
{{- if $gen.namespaceRequirements -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* NOTES.txt: a webhook's failure policy as written (envelope.failurePolicy: Ignore with
webhooks.safeInstall) and, with safeInstall, what a ready replica raises it to. */}}
{{- define "envelope.notesPolicy" -}}
{{ include "envelope.failurePolicy" (dict "root" .root "want" .want) }}{{ if and .root.Values.webhooks.safeInstall (ne .want "Ignore") }} until a replica is ready, then {{ .want }}{{ end }}
{{- end }}
