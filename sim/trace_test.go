package sim

import (
	"strings"
	"testing"
)

func TestReadTrace(t *testing.T) {
	reqs, err := ReadTrace(strings.NewReader("arrival_s,input_tokens,output_tokens,prefix_blocks\n0.000,10,5,0 1 2\n0.5,20,6,\n\n1.25,30,7,3\n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 || reqs[0].PrefixBlocks[2] != 2 || reqs[1].PrefixBlocks != nil || reqs[2].ArrivalS != 1.25 || reqs[2].OutputTokens != 7 {
		t.Fatalf("%+v", reqs)
	}
	if reqs, _ := ReadTrace(strings.NewReader("arrival_s,input_tokens,output_tokens\n0,1,1\n1,1,1\n2,1,1\n"), 2); len(reqs) != 2 {
		t.Fatalf("limit: %d rows", len(reqs))
	}
	for _, bad := range []string{
		"", "a,b,c\n", "arrival_s,input_tokens,output_tokens\n1,x,1\n",
		"arrival_s,input_tokens,output_tokens\n2,1,1\n1,1,1\n", "arrival_s,input_tokens,output_tokens\n1,1\n",
		"arrival_s,input_tokens,output_tokens\n1,-1,1\n", "arrival_s,input_tokens,output_tokens,prefix_blocks\n1,1,1,a b\n",
	} {
		if _, err := ReadTrace(strings.NewReader(bad), 0); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestLoadSharedTraces(t *testing.T) {
	for _, name := range []string{"azure-2023-conv.csv.gz"} {
		reqs, err := LoadTrace("testdata/"+name, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) != 100 || reqs[99].ArrivalS <= 0 {
			t.Fatalf("%s: %d rows", name, len(reqs))
		}
	}
}

// ScaleRate compresses time in copies: the workload given is left as it was.
func TestScaleRate(t *testing.T) {
	reqs := []Request{{ArrivalS: 2, InputTokens: 10}, {ArrivalS: 6, InputTokens: 20}}
	changes := []Change{{AtS: 4, Direction: "up"}}
	rs, cs := ScaleRate(reqs, changes, 2)
	if rs[0].ArrivalS != 1 || rs[1].ArrivalS != 3 || rs[1].InputTokens != 20 || cs[0].AtS != 2 || cs[0].Direction != "up" {
		t.Fatalf("scaled %+v %+v", rs, cs)
	}
	if reqs[1].ArrivalS != 6 || changes[0].AtS != 4 {
		t.Fatalf("the input changed: %+v %+v", reqs, changes)
	}
	if _, cs := ScaleRate(reqs, nil, 2); cs != nil {
		t.Fatalf("no changes in, %v out", cs)
	}
}
