set terminal pngcairo size 1400,560 font ',11'
set output '/work/main/demo-out/demo.png'
set multiplot layout 1,2 title 'Meridian demo: 6 nodes, sync hybrid, test accuracy 86.9%'
set title 'Minimum round trip, plane wan-a (ms), before the congestion'
set xtics ("london" 0, "virginia" 1, "singapore" 2)
set ytics ("london" 0, "virginia" 1, "singapore" 2)
set yrange [] reverse
set xlabel 'to'
set ylabel 'from'
set cbrange [0:*]
set palette defined (0 '#f7fbff', 1 '#6baed6', 2 '#08306b')
unset key
plot '/work/main/demo-out/matrix.dat' using 1:2:3 with image, '' using 1:2:(sprintf('%.0f', $3)) with labels tc rgb 'black'
unset xtics; unset ytics; set xtics; set ytics; set yrange [*:*] noreverse
set title 'Training rate and allreduce bus bandwidth'
set xlabel 'seconds since training started'
set ylabel 'samples/s'
set y2label 'busbw (MB/s)'
set y2tics
set key bottom left opaque
set arrow from 19.4, graph 0 to 19.4, graph 1 nohead lc rgb 'red' dt 2
set label 'wan-a london-virginia cut to 4 Mbit/s' at 19.4, graph 0.97 tc rgb 'red' offset 0.5,0
plot '/work/main/demo-out/rate.dat' using 1:2 with lines lw 2 title 'samples/s (rank 0, 10 s average)', \
     '/work/main/demo-out/busbw.dat' using 1:2 axes x1y2 with points pt 7 ps 0.4 title 'allreduce busbw'
unset multiplot
