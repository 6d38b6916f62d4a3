package sim

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes the report as plain-text tables, one per scenario and
// load, with inferroute's reduction versus round-robin under each table and
// the skipped scenarios at the end. Times are in milliseconds.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	for i := range r.Scenarios {
		s := &r.Scenarios[i]
		fmt.Fprintf(&b, "== %s at %.0f%% load: %.2f req/s of %.2f capacity, %d requests, %s\n",
			s.Name, 100*s.Load, s.Rate, s.Capacity, s.Requests, fleetString(s.Pods))
		fmt.Fprintf(&b, "   %s; goodput SLO: TTFT ≤ %s and TPOT ≤ %s\n", s.Description, fmtDur(s.SLO.TTFT), fmtDur(s.SLO.TPOT))
		wl := s.Workload
		fmt.Fprintf(&b, "   traffic: prompt %.0f and output %.0f tokens on average, inter-arrival CV %.1f, shared prefix %.0f%%, LoRA %.0f%%\n",
			wl.PromptMean, wl.OutputMean, wl.InterArrivalCV, 100*wl.SharedPrefix, 100*wl.AdapterFraction)
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\tTTFT mean\tp50\tp99\tTPOT mean\tp99\tE2E p99\tout tok/s\tgoodput\tSLO %\tprefix hit\tpreempt\timbalance\tfailed\t")
		for _, m := range s.Policies {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.2f\t%.1f\t%.1f%%\t%d\t%.2f\t%d\t\n",
				m.Policy, ms(m.TTFTMean), ms(m.TTFTP50), ms(m.TTFTP99), ms(m.TPOTMean), ms(m.TPOTP99), ms(m.E2EP99),
				m.OutputTokensPerSec, m.Goodput, 100*m.SLOAttainment, 100*m.PrefixHitRate, m.Preemptions, m.Imbalance, m.Failed)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if s.Reduction != nil {
			fmt.Fprintf(&b, "   inferroute vs round-robin: mean TTFT %s, p99 TTFT %s\n",
				reductionString(s.Reduction.TTFTMean), reductionString(s.Reduction.TTFTP99))
		}
		b.WriteByte('\n')
	}
	if len(r.Scenarios) > 0 {
		b.WriteString("times in ms; goodput in requests/s meeting the SLO; imbalance = max/mean requests per pod\n")
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(&b, "skipped %s\n", s)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ms(sec float64) string {
	v := sec * 1000
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtDur(d time.Duration) string {
	if d == 0 {
		return "∞"
	}
	return d.String()
}

func reductionString(pct float64) string {
	if pct >= 0 {
		return fmt.Sprintf("%.1f%% lower", pct)
	}
	return fmt.Sprintf("%.1f%% HIGHER", -pct)
}

// fleetString summarises profiles as "8×h100-llama3-8b" or
// "2×h100-llama3-8b + 3×a100-llama3-8b", in order of first appearance.
func fleetString(profiles []string) string {
	var names []string
	counts := map[string]int{}
	for _, p := range profiles {
		if counts[p] == 0 {
			names = append(names, p)
		}
		counts[p]++
	}
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d×%s", counts[n], n)
	}
	return strings.Join(parts, " + ")
}
