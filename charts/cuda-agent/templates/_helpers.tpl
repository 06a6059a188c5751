{{/* Names, labels and the few facts several templates share. */}}

{{- define "cuda-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cuda-agent.fullname" -}}
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

{{/* Labels of every object; objects with a selector add it (name + instance) themselves. */}}
{{- define "cuda-agent.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: cuda-agent
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "cuda-agent.labels" -}}
{{ include "cuda-agent.commonLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The operator's pods carry app.kubernetes.io/name=cuda-agent-operator: every SandboxPool's
NetworkPolicy admits the operator by that label (operator/labels.py OPERATOR_NAME). */}}
{{- define "cuda-agent.operatorSelector" -}}
app.kubernetes.io/name: cuda-agent-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cuda-agent.componentSelector" -}}
app.kubernetes.io/name: {{ printf "cuda-agent-%s" .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "cuda-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "cuda-agent.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is set. */}}
{{- define "cuda-agent.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (toString .tag) -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the operator serves (namespaced mode): `watch.namespaces` or the release's. */}}
{{- define "cuda-agent.watchNamespaces" -}}
{{- $namespaces := .Values.operator.watch.namespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $namespaces) -}}
{{- end -}}

{{/* Where the artifacts Secret is created: the release namespace, the watched ones, and any listed. */}}
{{- define "cuda-agent.artifactsNamespaces" -}}
{{- $namespaces := list .Release.Namespace -}}
{{- if not .Values.operator.watch.allNamespaces -}}
{{- $namespaces = concat $namespaces (include "cuda-agent.watchNamespaces" . | fromJsonArray) -}}
{{- end -}}
{{- $namespaces = concat $namespaces .Values.artifacts.namespaces -}}
{{- toJson (uniq $namespaces) -}}
{{- end -}}

{{- define "cuda-agent.minioFullname" -}}
{{- printf "%s-minio" (include "cuda-agent.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cuda-agent.collectorFullname" -}}
{{- printf "%s-otel-collector" (include "cuda-agent.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The OTLP/HTTP endpoint given to the operator and trainer pods ("" when none). */}}
{{- define "cuda-agent.otelEndpoint" -}}
{{- if .Values.telemetry.collector.enabled -}}
{{- printf "http://%s.%s.svc:4318" (include "cuda-agent.collectorFullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.telemetry.endpoint -}}
{{- end -}}
{{- end -}}

{{/* MinIO root credentials: the values when given, else the ones a previous install generated (kept
across upgrades: MinIO's data is tied to them), else new random ones. Both the MinIO Secret and the
artifacts Secret need the same pair, so the first call of a render memoizes it (templates of one render
share the values map). */}}
{{- define "cuda-agent.minioCredentials" -}}
{{- if not (hasKey .Values.minio "_credentials") -}}
{{- $existing := (lookup "v1" "Secret" .Release.Namespace (include "cuda-agent.minioFullname" .)).data | default dict -}}
{{- $user := .Values.minio.rootUser | default (get $existing "MINIO_ROOT_USER" | b64dec) | default (printf "cuda-agent-%s" (randAlphaNum 8 | lower)) -}}
{{- $password := .Values.minio.rootPassword | default (get $existing "MINIO_ROOT_PASSWORD" | b64dec) | default (randAlphaNum 40) -}}
{{- $_ := set .Values.minio "_credentials" (dict "user" $user "password" $password) -}}
{{- end -}}
{{- toJson .Values.minio._credentials -}}
{{- end -}}

{{/* "true" when each namespace gets MinIO credentials of its own (the bundled MinIO only), else "". */}}
{{- define "cuda-agent.tenantCredentials" -}}
{{- if and .Values.minio.enabled .Values.artifacts.tenantCredentials -}}
true
{{- end -}}
{{- end -}}

{{/* Per-namespace MinIO credentials, {"<namespace>": {"accessKey", "secretKey"}}: those a previous
install generated (kept across upgrades, as MinIO holds them), else new random ones; memoized per render
like the root credentials (the artifacts Secrets and the tenants Secret need the same). */}}
{{- define "cuda-agent.minioTenants" -}}
{{- if not (hasKey .Values.minio "_tenants") -}}
{{- $existing := (lookup "v1" "Secret" .Release.Namespace (printf "%s-tenants" (include "cuda-agent.minioFullname" .))).data | default dict -}}
{{- $known := get $existing "tenants.json" | b64dec | default "{}" | fromJson -}}
{{- $tenants := dict -}}
{{- range $namespace := include "cuda-agent.artifactsNamespaces" . | fromJsonArray -}}
{{- $old := get $known $namespace | default dict -}}
{{- $_ := set $tenants $namespace (dict "accessKey" (printf "cuda-agent-%s" $namespace) "secretKey" (get $old "secretKey" | default (randAlphaNum 40))) -}}
{{- end -}}
{{- $_ := set .Values.minio "_tenants" $tenants -}}
{{- end -}}
{{- toJson .Values.minio._tenants -}}
{{- end -}}

{{/* Which seccomp installer applies: "daemonset", "securityProfilesOperator" or "" (none). */}}
{{- define "cuda-agent.seccompMode" -}}
{{- if .Values.seccomp.install -}}
{{- if eq .Values.seccomp.mode "auto" -}}
{{- if .Capabilities.APIVersions.Has "security-profiles-operator.x-k8s.io/v1beta1/SeccompProfile" -}}
securityProfilesOperator
{{- else -}}
daemonset
{{- end -}}
{{- else -}}
{{- .Values.seccomp.mode -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The localhostProfile path sandbox pods name (relative to the kubelet's seccomp directory). */}}
{{- define "cuda-agent.seccompLocalhostProfile" -}}
{{- if eq (include "cuda-agent.seccompMode" .) "securityProfilesOperator" -}}
{{- printf "operator/%s/%s-sandbox.json" .Release.Namespace (include "cuda-agent.fullname" .) -}}
{{- else -}}
cuda-agent/sandbox.json
{{- end -}}
{{- end -}}

{{/* The same for the user-namespace variant, named by pools with spec.security.userNamespaces: Required. */}}
{{- define "cuda-agent.seccompUsernsLocalhostProfile" -}}
{{- if eq (include "cuda-agent.seccompMode" .) "securityProfilesOperator" -}}
{{- printf "operator/%s/%s-sandbox-userns.json" .Release.Namespace (include "cuda-agent.fullname" .) -}}
{{- else -}}
cuda-agent/sandbox-userns.json
{{- end -}}
{{- end -}}

{{/* The restricted Pod Security container context every long-running container of the chart uses. */}}
{{- define "cuda-agent.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* "true" when the chart creates the artifacts Secret (it has an endpoint to put in it), else "". */}}
{{- define "cuda-agent.createsArtifactsSecret" -}}
{{- if and .Values.artifacts.createSecret (or .Values.minio.enabled .Values.artifacts.external.endpoint) -}}
true
{{- end -}}
{{- end -}}
