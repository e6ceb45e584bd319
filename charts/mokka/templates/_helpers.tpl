{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "mokka.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "mokka.fullname" -}}
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

{{- define "mokka.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mokka.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mokka.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mokka.labels" -}}
helm.sh/chart: {{ include "mokka.chart" . }}
{{ include "mokka.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "mokka.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mokka.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "mokka.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where the custom profile is mounted in the containers. */}}
{{- define "mokka.profileDir" -}}/etc/mokka/profile{{- end }}

{{/* The --profile argument: a built-in name, or the custom profile's file. */}}
{{- define "mokka.profileArg" -}}
{{- if .Values.gpu.customProfile }}
{{- printf "%s/profile.yaml" (include "mokka.profileDir" .) }}
{{- else }}
{{- .Values.gpu.profile }}
{{- end }}
{{- end }}

{{/* --profile/--gpus as YAML list items (for a container's args). */}}
{{- define "mokka.profileArgs" -}}
- --profile
- {{ include "mokka.profileArg" . | quote }}
{{- if not (kindIs "invalid" .Values.gpu.count) }}
- --gpus
- {{ .Values.gpu.count | int | toString | quote }}
{{- end }}
{{- end }}

{{/* The same as one shell word list (for preStop scripts). */}}
{{- define "mokka.profileShellArgs" -}}
--profile {{ include "mokka.profileArg" . | squote }}
{{- if not (kindIs "invalid" .Values.gpu.count) }} --gpus {{ .Values.gpu.count | int }}{{ end }}
{{- end }}

{{- define "mokka.nodeInfoRbac" -}}
{{- and .Values.nodeInfo.enabled .Values.rbac.create }}
{{- end }}

{{/* Whether rbac.ownNodePolicy asks for own-node ValidatingAdmissionPolicies (and the cluster serves them). */}}
{{- define "mokka.policyWanted" -}}
{{- $mode := toString .Values.rbac.ownNodePolicy }}
{{- if eq $mode "true" }}true
{{- else if and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}true
{{- end }}
{{- end }}

{{/* Whether to render the own-node ValidatingAdmissionPolicy of the node labeller's RBAC. */}}
{{- define "mokka.ownNodePolicy" -}}
{{- and (eq (include "mokka.nodeInfoRbac" .) "true") (eq (include "mokka.policyWanted" .) "true") }}
{{- end }}

{{/* `mokka dra-plugin`'s driver names, as YAML list items (its container's args and its preStop's). */}}
{{- define "mokka.draArgs" -}}
- --driver-name
- {{ .Values.dra.driverName | quote }}
- --nic-driver-name
- {{ .Values.dra.nicDriverName | quote }}
{{- end }}

{{/* Whether to render the DRA plugin's RBAC (dra.yaml). */}}
{{- define "mokka.draRbac" -}}
{{- and .Values.dra.enabled .Values.rbac.create }}
{{- end }}

{{/* The fault ConfigMap's name (faults.enabled). */}}
{{- define "mokka.faultsConfigMap" -}}
{{- default (printf "%s-faults" (include "mokka.fullname" .) | trunc 63 | trimSuffix "-") .Values.faults.configMap }}
{{- end }}

{{/* The annotations of uninstall-hook.yaml's objects: helm runs them before it deletes the release
(the RBAC first, weight -1, then the Job, 0), replaces any left from a failed uninstall and deletes
them once they succeed. The argument is the weight. */}}
{{- define "mokka.uninstallHook" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}


{{/* The fleet controller's pods: apart from the DaemonSet's (whose selector is name and instance). */}}
{{- define "mokka.fleetSelectorLabels" -}}
app.kubernetes.io/name: {{ include "mokka.name" . }}-fleet-controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The fleet's KWOK pod. */}}
{{- define "mokka.kwokSelectorLabels" -}}
app.kubernetes.io/name: {{ include "mokka.name" . }}-kwok
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
