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

{{/* The chart's Deployments as a JSON list, one entry per Deployment: its name, the role
it runs (`asynctier run <role>`), its priority tier ("" for every tier), the key of its
values under `roles`, whether KEDA owns its replica count, and (tailers) the KEDA bindings
it scales on. Beside the roles: a tailers Deployment per `roles.tailers.tiers` entry
(`run tailers --tier T`, its bindings those of `tier` T, "normal" when unsaid) and the
scheduler kept for the urgent tier (`roles.schedulerUrgent`). */}}
{{- define "asynctier.units" -}}
{{- $keda := $.Values.autoscaling.keda -}}
{{- $units := list -}}
{{- range $key := list "scheduler" "schedulerUrgent" "tailers" "delay" "submitter" "console" -}}
{{- $r := index $.Values.roles $key -}}
{{- if $r.enabled -}}
{{- if eq $key "schedulerUrgent" -}}
{{- $units = append $units (dict "name" "scheduler-urgent" "role" "scheduler" "tier" "urgent" "key" $key "scaled" false) -}}
{{- else if and (eq $key "tailers") $r.tiers -}}
{{- range $tier := $r.tiers -}}
{{- $bindings := list -}}
{{- range $keda.tailers.bindings -}}
{{- if eq (.tier | default "normal") $tier -}}{{- $bindings = append $bindings . -}}{{- end -}}
{{- end -}}
{{- $units = append $units (dict "name" (printf "tailers-%s" $tier) "role" $key "tier" $tier "key" $key "scaled" (and $keda.enabled (gt (len $bindings) 0)) "bindings" $bindings) -}}
{{- end -}}
{{- else -}}
{{- $units = append $units (dict "name" $key "role" $key "tier" "" "key" $key "scaled" (and $keda.enabled (has $key (list "scheduler" "tailers"))) "bindings" $keda.tailers.bindings) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $units -}}
{{- end -}}
