{{- define "ragwarm.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "ragwarm.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ragwarm.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ragwarm.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Environment shared by every container: Kafka, Qdrant, extra values. */}}
{{- define "ragwarm.env" -}}
- name: RAGWARM_KAFKA_BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: RAGWARM_KAFKA_TOPIC_PREFIX
  value: {{ .Values.kafka.topicPrefix | quote }}
- name: RAGWARM_QDRANT_URL
  value: {{ .Values.qdrant.url | quote }}
{{- range $k, $v := .Values.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{- define "ragwarm.extraEnv" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* The Secret holding operator-key and signing-secret: the user's, or the generated one. */}}
{{- define "ragwarm.keysSecret" -}}
{{- .Values.security.existingSecret | default (printf "%s-keys" (include "ragwarm.fullname" .)) -}}
{{- end -}}

{{/* Key variables of one component (.vars: variable -> Secret key), or the opt-out. */}}
{{- define "ragwarm.securityEnv" -}}
{{- if .root.Values.security.insecure }}
- name: RAGWARM_INSECURE  # security.insecure: open views/API, unsigned events; each warns
  value: "true"
{{- else }}
{{- $secret := include "ragwarm.keysSecret" .root }}
{{- range $var, $key := .vars }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- end -}}
