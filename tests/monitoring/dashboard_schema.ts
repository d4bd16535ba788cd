// The type check_dashboards.sh holds each dashboard to: Grafana's published dashboard schema
// (the `Dashboard` type of @grafana/schema, the classic dashboard JSON model), with the
// targets and annotation queries typed as the Prometheus datasource stores them.
import type { AnnotationQuery, Dashboard, DataQuery, Panel, RowPanel } from '@grafana/schema';

// The Prometheus datasource's query model (Grafana's PromQuery). The dashboard schema types
// panel targets as Record<string, unknown> and annotation targets as a bare DataQuery, and
// @grafana/schema no longer ships the Prometheus dataquery kind, so its fields are spelled
// out here: stricter than the schema alone (expr is required, format and editorMode closed).
export interface PromQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  format?: 'time_series' | 'table' | 'heatmap';
  editorMode?: 'code' | 'builder';
  exemplar?: boolean;
  interval?: string;
  intervalFactor?: number;
}

// What the Prometheus datasource reads beside an annotation's target.
export interface PromAnnotationFields {
  step?: string;
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
}

export type PromPanel = Omit<Panel, 'targets'> & { targets?: PromQuery[] };
export type PromRowPanel = Omit<RowPanel, 'panels'> & { panels: PromPanel[] };

export type PrometheusDashboard = Omit<Dashboard, 'panels' | 'annotations'> & {
  panels?: Array<PromPanel | PromRowPanel>;
  annotations?: { list?: Array<AnnotationQuery<PromQuery> & PromAnnotationFields> };
};

// Json<T>: T as a JSON file can spell it. TypeScript enums are nominal (the string
// "absolute" is not assignable to ThresholdsMode.Absolute), so each string enum becomes the
// union of its values; numeric enums already accept their numbers. Everything else (required
// fields, closed unions, nesting) is kept, and `any` stays `any`.
export type Json<T> =
  0 extends 1 & T ? T :
  T extends string ? `${T}` :
  T extends number | boolean | null | undefined ? T :
  T extends ReadonlyArray<infer U> ? Array<Json<U>> :
  T extends object ? { [K in keyof T]: Json<T[K]> } :
  T;

export type DashboardJson = Json<PrometheusDashboard>;
