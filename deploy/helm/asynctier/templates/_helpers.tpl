{{/* The release's name for its objects: "<release>-asynctier", or the release alone when it
already says asynctier. */}}
{{- define "asynctier.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "asynctier.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one role: (dict "root" $ "role" "scheduler"). */}}
{{- define "asynctier.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "asynctier.secretName" -}}
{{- if .Values.secrets.create -}}
{{- include "asynctier.fullname" . -}}
{{- else -}}
{{- required "secrets.name: name the Secret you made (secrets.create is false)" .Values.secrets.name -}}
{{- end -}}
{{- end -}}

{{- define "asynctier.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The scheduler's stop grace: its default, or longer when a binding's timeout is. */}}
{{- define "asynctier.schedulerStopGrace" -}}
{{- max (int .Values.drain.schedulerStopGraceSeconds) (int .Values.drain.longestBindingTimeoutSeconds) -}}
{{- end -}}

{{/* The seconds a role's process may take to stop after its SIGTERM. */}}
{{- define "asynctier.stopBound" -}}
{{- $d := .root.Values.drain -}}
{{- if eq .role "scheduler" -}}{{ include "asynctier.schedulerStopGrace" .root }}
{{- else if eq .role "submitter" -}}{{ int $d.submitterStopGraceSeconds }}
{{- else if eq .role "console" -}}{{ int $d.consoleStopSeconds }}
{{- else -}}{{ int $d.tailersStopSeconds }}
{{- end -}}
{{- end -}}

{{/* A role behind a Service (scheduler, Submitter) sleeps before its SIGTERM, so that
endpoints drop it before it refuses calls. */}}
{{- define "asynctier.preStop" -}}
{{- if has .role (list "scheduler" "submitter") -}}{{ int .root.Values.drain.preStopSleepSeconds }}{{ else }}0{{ end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds of a role: preStop + its stop bound + margin. */}}
{{- define "asynctier.grace" -}}
{{- add (include "asynctier.preStop" . | int) (include "asynctier.stopBound" . | int) (int .root.Values.drain.marginSeconds) -}}
{{- end -}}
