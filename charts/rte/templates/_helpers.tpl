{{/*
Names, labels and the checks the schema cannot express. Names are cut to 63 characters, the
limit of a DNS label; the StatefulSet's pod names add "-<ordinal>" to the full name.
*/}}

{{- define "rte.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: the release name when it already contains the chart's name, so that
"helm install rte ./charts/rte" makes pods rte-0, rte-1 rather than rte-rte-0.
*/}}
{{- define "rte.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rte.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rte.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rte.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rte.labels" -}}
helm.sh/chart: {{ include "rte.chart" . }}
{{ include "rte.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: runner
app.kubernetes.io/part-of: rte
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rte.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rte.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rte.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The address of one pod, for RTE_URL and for NOTES.txt; $(POD_NAME) inside the pod. */}}
{{- define "rte.podHost" -}}
{{- $pod := index . 0 }}{{- $root := index . 1 }}
{{- printf "%s.%s.%s.svc" $pod (include "rte.fullname" $root) $root.Release.Namespace }}
{{- with $root.Values.clusterDomain }}.{{ . }}{{ end }}
{{- end }}

{{- define "rte.scheme" -}}
{{- ternary "https" "http" .Values.https }}
{{- end }}

{{- define "rte.terminationGracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add .Values.drainSeconds 20 }}
{{- else }}
{{- .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
A secret value: the Secret and key it is read from, or nothing when neither value nor
existingSecret is set. Called with (list <the value's block> <its key in the chart's Secret> <root>).
*/}}
{{- define "rte.secretRef" -}}
{{- $v := index . 0 }}{{- $key := index . 1 }}{{- $root := index . 2 }}
{{- if $v.existingSecret }}
name: {{ $v.existingSecret }}
key: {{ $v.existingSecretKey }}
{{- else if $v.value }}
name: {{ include "rte.fullname" $root }}
key: {{ $key }}
{{- end }}
{{- end }}

{{/*
What values.schema.json cannot say: combinations of values. Each message names the value to
set, as the RTE's own settings check does.
*/}}
{{- define "rte.validate" -}}
{{- $v := .Values }}
{{- if and (not $v.token.value) (not $v.token.existingSecret) }}
{{- fail "token: the RTE does not start without RTE_TOKEN: set token.existingSecret (a Secret holding it under token.existingSecretKey) or token.value (at least 16 characters, e.g. the output of openssl rand -hex 32)" }}
{{- end }}
{{- if and $v.token.value $v.token.existingSecret }}
{{- fail "token: set token.value or token.existingSecret, not both" }}
{{- end }}
{{- if and $v.token.value (lt (len $v.token.value) 16) }}
{{- fail "token.value: shorter than 16 characters, and the RTE refuses it: set a random string of at least 16 (e.g. openssl rand -hex 32)" }}
{{- end }}
{{- if and $v.joinToken.value $v.joinToken.existingSecret }}
{{- fail "joinToken: set joinToken.value or joinToken.existingSecret, not both" }}
{{- end }}
{{- if and $v.metrics.token.value $v.metrics.token.existingSecret }}
{{- fail "metrics.token: set metrics.token.value or metrics.token.existingSecret, not both" }}
{{- end }}
{{- if and (eq $v.mode "outbound") (not $v.appUrl) }}
{{- fail "appUrl: required with mode: outbound, because each pod dials the app: set the app's address, such as https://forms.example.com" }}
{{- end }}
{{- if and (or $v.joinToken.value $v.joinToken.existingSecret) (not $v.appUrl) }}
{{- fail "joinToken: is only sent to the app at appUrl, which is empty: set appUrl, or leave joinToken empty" }}
{{- end }}
{{- if and (eq $v.files "local") (or (not $v.localFiles.ansiblePath) (not $v.localFiles.repoPath)) }}
{{- fail "localFiles: files: local needs localFiles.ansiblePath and localFiles.repoPath (the playbooks and repositories on the pod, mounted with extraVolumes and extraVolumeMounts)" }}
{{- end }}
{{- if le (int (include "rte.terminationGracePeriodSeconds" .)) (int $v.drainSeconds) }}
{{- fail (printf "terminationGracePeriodSeconds: %v is not longer than drainSeconds (%v), so running jobs would be killed before they end: make it longer, or leave it empty for drainSeconds + 20" $v.terminationGracePeriodSeconds $v.drainSeconds) }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled (not (or $v.metrics.token.value $v.metrics.token.existingSecret)) }}
{{- fail "metrics.serviceMonitor.enabled: /metrics is 404 without a metrics token: set metrics.token.value or metrics.token.existingSecret" }}
{{- end }}
{{- if and $v.networkPolicy.enabled (eq $v.mode "inbound") (not $v.networkPolicy.from) }}
{{- fail "networkPolicy.from: empty with mode: inbound, so the app could not dial the pods: list the app's pods (a podSelector, with a namespaceSelector when it runs in another namespace)" }}
{{- end }}
{{- if and $v.sharedCache.enabled (eq $v.files "local") }}
{{- fail "sharedCache.enabled: the cache holds bundles the app transfers, and files: local uses none: turn sharedCache off, or use files: transfer" }}
{{- end }}
{{- end }}
