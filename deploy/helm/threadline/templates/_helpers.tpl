{{/* The release's name for its objects, cut to what a label value takes. */}}
{{- define "threadline.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "threadline.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one role: (dict "root" $ "role" "worker") */}}
{{- define "threadline.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "threadline.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The environment every role shares: the ConfigMap (no secrets), the instance id from
the pod's own name (a StatefulSet's pods are <name>-0, -1...: unique, and the same
after a restart, which is what static membership and transactional ids need), and
the secrets by reference.
*/}}
{{- define "threadline.env" -}}
- name: THREADLINE_INSTANCE_ID
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
{{- if .Values.kafka.saslUsername }}
- name: THREADLINE_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ required "secrets.kafkaPassword.name: the Secret with the SASL password (kafka.saslUsername is set)" .Values.secrets.kafkaPassword.name }}
      key: {{ .Values.secrets.kafkaPassword.key }}
{{- end }}
{{- end -}}

{{- define "threadline.envFrom" -}}
- configMapRef:
    name: {{ include "threadline.fullname" . }}-env
{{- end -}}

{{/* The data volume's mount, and the CA of the brokers' TLS when given. */}}
{{- define "threadline.mounts" -}}
- name: data
  mountPath: /var/lib/threadline
{{- if .Values.kafka.caSecret.name }}
- name: kafka-ca
  mountPath: /etc/threadline/kafka-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "threadline.caVolume" -}}
{{- if .Values.kafka.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.caSecret.name }}
    items: [{key: {{ .Values.kafka.caSecret.key }}, path: ca.crt}]
{{- end }}
{{- end -}}

{{/* Settings that are secrets: never a plain value (the chart reads them from Secrets). */}}
{{- define "threadline.secretNames" -}}
THREADLINE_API_KEYS THREADLINE_KAFKA_SASL_PASSWORD THREADLINE_RESUME_TOKEN_KEYS THREADLINE_AGENT_OPENAI_API_KEY
{{- end -}}

{{/* A role's own THREADLINE_* settings (a map) as env entries; a secret one is refused. */}}
{{- define "threadline.extraEnv" -}}
{{- $secrets := splitList " " (include "threadline.secretNames" .) -}}
{{- range $name, $value := . }}
{{- if has $name $secrets }}
{{- fail (printf "%s is a secret: give it by reference (secrets.*, worker.secretEnv), never as a value" $name) }}
{{- end }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "threadline.metricsAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
